"""A Llama-family decoder in plain PyTorch, shaped for serving.

Projections that read the same input are fused (`qkv_proj`, `gate_up_proj`) so a step issues
fewer, larger matmuls. Attention reads and writes a `KVCache` owned by the runner; what a step
attends to travels explicitly in `AttentionMetadata`. Numerics follow the reference Llama
(RMSNorm and rotary embedding computed in float32), so float32 runs match transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engines import kernels
from engines.kv.attention import AttentionMetadata, KVCache, attend
from engines.model.config import ModelConfig


def uninitialized_embedding(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """An embedding whose weight the checkpoint fills: skipping the random init matters because
    nn.Embedding's normal_ on the meta device imports torch's compiler stack (a second of start-up)."""
    return nn.Embedding(num_embeddings, embedding_dim, _weight=torch.empty(num_embeddings, embedding_dim))


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """`x` divided by its root mean square over the last dimension, computed in float32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """Llama's RMSNorm: normalize in float32, cast back, then scale by the weight."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms_normalize(x, self.eps).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables in the rotate-half layout, float32, for positions below `max_positions`.

    Tables are computed in blocks of ROTARY_BLOCK positions as positions are first used (a model
    with a 128k context does not hold 128k rows it never reaches), always with the same shapes
    and the same ops, so a position's values never depend on which step first needed them.
    `scaling_factor` divides the frequencies (linear rope scaling)."""

    ROTARY_BLOCK = 1024

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling_factor: float = 1.0):
        super().__init__()
        # Always on the CPU, even while the model is built on the meta device: the tables are
        # computed, not loaded (and meta tensor math would import torch's compiler stack).
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
        self.inv_freq = 1.0 / (theta**exponents) / scaling_factor
        self.max_positions = max_positions
        self.cos_half = torch.empty(0, head_dim // 2, device="cpu")  # [computed positions, head_dim / 2]
        self.sin_half = torch.empty(0, head_dim // 2, device="cpu")

    def _extend(self, num_positions: int) -> None:
        blocks_cos, blocks_sin = [self.cos_half], [self.sin_half]
        for start in range(self.cos_half.shape[0], num_positions, self.ROTARY_BLOCK):
            positions = torch.arange(start, start + self.ROTARY_BLOCK, dtype=torch.int64, device="cpu").float()
            # The float32 angle, as transformers computes it; cos and sin in float64 rounded to
            # float32, so the tables do not depend on the CPU's vector math library either.
            angles = (positions[:, None] * self.inv_freq[None, :]).double()
            blocks_cos.append(angles.cos().float())
            blocks_sin.append(angles.sin().float())
        self.cos_half, self.sin_half = torch.cat(blocks_cos), torch.cat(blocks_sin)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [tokens, head_dim] for `positions` [tokens], in `dtype`."""
        cos, sin = self._half_tables(positions)
        return torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((sin, sin), dim=-1).to(dtype)

    def rotation(self, positions: torch.Tensor, dtype: torch.dtype) -> Rotation:
        """The step's tables in the shape `apply_rotary` reads; looked up once per step, used by every layer."""
        cos, sin = self._half_tables(positions)
        cos, signed_sin = torch.cat((cos, cos), dim=-1).to(dtype), torch.cat((-sin, sin), dim=-1).to(dtype)
        return Rotation(cos[:, None, :], signed_sin[:, None, :])

    def _half_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.numel():
            deepest = int(positions.max())
            if deepest >= self.max_positions:
                raise ValueError(f"position {deepest} is beyond the rotary table ({self.max_positions})")
            if deepest >= self.cos_half.shape[0]:
                self._extend(deepest + 1)
        return self.cos_half[positions], self.sin_half[positions]


@dataclass(frozen=True, slots=True)
class Rotation:
    """One step's rotary tables, [tokens, 1, head_dim] each so they broadcast over heads: cos, and
    sin with the first half negated (the rotate-half sign folded into the table)."""

    cos: torch.Tensor
    signed_sin: torch.Tensor


def apply_rotary(x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
    """Rotate x: [tokens, heads, head_dim] in the rotate-half layout.

    x * cos + rotate_half(x) * sin, where rotate_half(x) = (-x2, x1): rolling x by half a head
    gives (x2, x1) and the table's sign supplies the minus, so the result has the same bits as
    the reference formula ((-a) * b == a * (-b) exactly) in four ops instead of nine."""
    return x * rotation.cos + x.roll(x.shape[-1] // 2, -1) * rotation.signed_sin


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.scale = self.head_dim**-0.5
        self.sliding_window: int | None = None  # models with local layers set it per layer

    has_qk_norm = False  # subclasses that normalize q and k per head set it and override normalize_qk

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head q/k normalization before the rotary embedding; Llama has none."""
        return q, k

    def forward(
        self,
        hidden: torch.Tensor,
        rope: Rotation,
        cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens, num_heads, head_dim = hidden.shape[0], self.num_heads, self.head_dim
        qkv = self.qkv_proj(hidden)
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = qk.view(num_tokens, num_heads + self.num_kv_heads, head_dim)  # q's heads, then k's
        if self.has_qk_norm:
            q, k = self.normalize_qk(qk[:, :num_heads], qk[:, num_heads:])
            q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        else:  # one rotation for q and k together: half the ops
            qk = apply_rotary(qk, rope)
            q, k = qk[:, :num_heads], qk[:, num_heads:]
        v = v.view(num_tokens, self.num_kv_heads, head_dim)
        out = attend(q, k, v, cache, self.layer_index, meta, self.scale, sliding_window=self.sliding_window)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    """Gated MLP with fused gate/up projections; subclasses change only `activation` (and name it
    for the batch-invariant kernel, which computes activation(gate) * up in one pass)."""

    activation_name = "silu"

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.kernel_isa: str | None = None

    def use_kernel(self, isa: str) -> None:
        self.kernel_isa = isa

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.kernel_isa is not None:
            return self.down_proj(kernels.act_and_mul(gate_up, self.activation_name, self.kernel_isa))
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(self.activation(gate) * up)

    @staticmethod
    def activation(gate: torch.Tensor) -> torch.Tensor:
        return F.silu(gate)


def run_fused(fused: torch.ScriptObject, hidden: torch.Tensor, rope: Rotation, cache: KVCache, meta: AttentionMetadata):
    """The whole layer in one C++ call (engines/model/fused.py): the module path's bits."""
    return fused.forward(
        hidden, rope.cos, rope.signed_sin, cache.keys, cache.values, meta.slot_mapping, meta.block_tables,
        meta.token_seq, meta.positions, cache.block_size,
    )  # fmt: skip


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        self.fused: torch.ScriptObject | None = None  # set by engines.model.fused

    def forward(self, hidden, rope, cache, meta) -> torch.Tensor:
        if self.fused is not None and meta.fused_step:
            return run_fused(self.fused, hidden, rope, cache, meta)
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rope, cache, meta)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaForCausalLM(nn.Module):
    """Llama decoder with its language-model head. `forward` returns the last position's logits."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = uninitialized_embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids: [num_tokens] int64 -> float32 logits [len(meta.logits_indices), vocab_size]."""
        return self.compute_logits(self.hidden_states(input_ids, cache, meta)[meta.logits_indices])

    @torch.inference_mode()
    def hidden_states(self, input_ids: torch.Tensor, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """The last layer's output [num_tokens, hidden_size], before the final norm: the runner picks
        the rows it wants logits of (sampled rows, scored prompt positions)."""
        hidden = self.embed_tokens(input_ids)
        rope = self.rotary.rotation(meta.positions, hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, rope, cache, meta)
        return hidden

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Rows of `hidden_states` [rows, hidden_size] -> float32 logits [rows, vocab_size]."""
        return self.lm_head(self.norm(hidden)).float()
