"""A Hugging Face directory (config.json + safetensors + tokenizer files) loads into the same
runner and matches transformers on it."""

from __future__ import annotations

import torch

from engines.model.source import SourceKind, resolve_model
from engines.runner.loader import load
from engines.runner.model_runner import ModelRunner


def test_hf_directory_matches_transformers_logits_and_greedy_tokens(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    source = resolve_model(str(tiny_model_dir))
    assert source.kind is SourceKind.HF_DIRECTORY and source.name == tiny_model_dir.name
    loaded = load(source, torch.float32)
    assert loaded.tokenizer.eos_token_ids == {0, 2}  # tokenizer eos plus generation_config.json's list
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()

    ids = loaded.tokenizer.tokenizer("A tiny model still computes the same function").input_ids
    runner = ModelRunner(loaded, 128)
    logits = runner.forward(ids, 0)
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0, -1]
    assert (logits - expected).abs().max().item() < 1e-4

    tokens, last = [], int(logits.argmax())
    for _ in range(16):
        tokens.append(last)
        last = int(runner.forward([last], len(ids) + len(tokens) - 1).argmax())
    with torch.inference_mode():
        generated = reference.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=16,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(ids) :].tolist()
    assert tokens == generated
