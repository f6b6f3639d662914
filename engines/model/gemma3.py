"""Gemma 3 (text) in plain PyTorch, shaped for serving like the Llama model beside it.

Same fused projections (`qkv_proj`, `gate_up_proj`), same `forward(input_ids, cache, meta)`
and the same shared `attend`. What is Gemma's (see docs/gemma3.md for how each was checked):
embeddings scaled by sqrt(hidden_size) in the model dtype; RMSNorm scaling by (1 + weight), with
zero-centred weights as in Hugging Face checkpoints; per-head RMSNorm of q and k before rotary;
norms after attention and after the MLP as well as before; a GeGLU MLP (tanh-approximated GELU);
queries scaled by query_pre_attn_scalar ** -0.5; sliding-window layers with their own rope base
between global ones; an optional final logit softcap. Numerics follow transformers' Gemma 3, so
float32 runs match it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engines.kv.attention import AttentionMetadata, KVCache
from engines.model.config import ModelConfig
from engines.model.llama import (
    LlamaAttention,
    LlamaMLP,
    RMSNorm,
    RotaryEmbedding,
    rms_normalize,
    run_fused,
    uninitialized_embedding,
)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: scaled by (1 + weight), the scaling too in float32 (as Gemma's reference)."""

    def __init__(self, size: int, eps: float):
        super().__init__(size, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (rms_normalize(x, self.eps) * (1.0 + self.weight.float())).to(x.dtype)


class Gemma3Attention(LlamaAttention):
    """Llama attention plus per-head q/k RMSNorm, a scale from query_pre_attn_scalar, and a
    sliding window on local layers."""

    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__(config, layer_index)
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
        self.sliding_window = config.sliding_window if config.is_sliding[layer_index] else None

    has_qk_norm = True

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)


class Gemma3MLP(LlamaMLP):
    """Llama's gated MLP with GELU (tanh approximation) as the gate's activation."""

    activation_name = "gelu_tanh"

    @staticmethod
    def activation(gate: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh")


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.is_sliding = config.is_sliding[layer_index]
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.self_attn = Gemma3Attention(config, layer_index)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.mlp = Gemma3MLP(config)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.fused: torch.ScriptObject | None = None  # set by engines.model.fused

    def forward(self, hidden, rope, cache, meta) -> torch.Tensor:
        if self.fused is not None and meta.fused_step:
            return run_fused(self.fused, hidden, rope, cache, meta)
        attended = self.self_attn(self.input_layernorm(hidden), rope, cache, meta)
        hidden = hidden + self.post_attention_layernorm(attended)
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))


class Gemma3ForCausalLM(nn.Module):
    """Gemma 3 decoder with its (tied) language-model head; called exactly like LlamaForCausalLM."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if len(config.is_sliding) != config.num_layers:
            raise ValueError(f"is_sliding has {len(config.is_sliding)} entries for {config.num_layers} layers")
        self.config = config
        self.embed_tokens = uninitialized_embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        head_dim, max_positions = config.head_dim, config.max_position_embeddings
        local_theta = config.rope_local_theta or config.rope_theta
        self.rotary_local = RotaryEmbedding(head_dim, max_positions, local_theta)
        self.rotary_global = RotaryEmbedding(head_dim, max_positions, config.rope_theta, config.rope_scaling_factor)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids: [num_tokens] int64 -> float32 logits [len(meta.logits_indices), vocab_size]."""
        return self.compute_logits(self.hidden_states(input_ids, cache, meta)[meta.logits_indices])

    @torch.inference_mode()
    def hidden_states(self, input_ids: torch.Tensor, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """The last layer's output [num_tokens, hidden_size], before the final norm."""
        config = self.config
        hidden = self.embed_tokens(input_ids)
        # The scale is rounded to float32 and then to the model dtype, as transformers does.
        hidden = hidden * torch.tensor(config.hidden_size**0.5).to(hidden.dtype)
        local = self.rotary_local.rotation(meta.positions, hidden.dtype)
        global_ = self.rotary_global.rotation(meta.positions, hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, local if layer.is_sliding else global_, cache, meta)
        return hidden

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Rows of `hidden_states` [rows, hidden_size] -> float32 logits [rows, vocab_size], soft-capped."""
        config = self.config
        logits = self.lm_head(self.norm(hidden)).float()
        if config.final_logit_softcap is not None:
            logits = torch.tanh(logits / config.final_logit_softcap) * config.final_logit_softcap
        return logits
