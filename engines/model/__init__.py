"""The model room: what a forward computes and how a model is read.

The model's config (read once), its source files, GGUF reader, tokenizer, numerics, quantized
weights, the Llama and Gemma 3 modules and their fused kernel layers.
"""
