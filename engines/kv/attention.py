"""Paged attention over the engine's KV cache, shared by every model.

A model computes q, k and v for the step's tokens, applies its own position encoding, and calls
`attend`. Where keys and values live (blocks of the paged cache, addressed by flat slot numbers)
and which cached tokens each query may see (causality, sliding windows) are decided here and in
`AttentionMetadata`, which the runner builds once per step and every layer reuses.

Two ways to compute it, chosen once per engine (engines/model/numerics.py) and named by the metadata:
- the batch-invariant kernel (`kernel_isa` set): every query, decode or prefill, attends alone to
  its own sequence's keys in one fixed order (engines/kernels/csrc/attention.h), so its output
  does not depend on the batch, the padding or how its prompt was chunked;
- torch's ops (`kernel_isa` None): single-token queries (decodes) of all sequences are computed
  together, their block tables gathered into one padded [batch, max_blocks] index, whole blocks
  at a time; multi-token chunks (prefills) one sequence at a time with a causal mask offset by
  what the sequence already has cached. Faster on some shapes, but the padded width and the
  chunking change the rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from engines import kernels


class ContextExchange(Protocol):
    """What attention asks of a decode-context-parallel group (engines/parallel/dcp_exchange.py's
    `DcpExchange` is the one implementation): a protocol, so the KV room does not import the
    parallel room that builds on it."""

    def gather_queries(self, q: torch.Tensor) -> torch.Tensor:
        """q [tokens, local heads, D] float32 -> the group's [tokens, C * local heads, D]."""
        ...

    def combine_partials(self, out: torch.Tensor, lse: torch.Tensor, isa: str) -> torch.Tensor:
        """Partial outputs and LSEs for the group's heads -> this rank's heads, combined."""
        ...


class KVCache:
    """Keys and values of every layer: `keys[layer]` is [kv_heads, num_blocks * block_size, head_dim],
    so the slot of a sequence's token at position p is block_table[p // block_size] * block_size
    + p % block_size. Heads lead so that gathering a batch's slots yields [kv_heads, ..., head_dim]
    tensors that matmul and attention kernels read without another copy."""

    def __init__(
        self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int, block_size: int, dtype: torch.dtype
    ):
        shape = (num_layers, num_kv_heads, num_blocks * block_size, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype)
        self.values = torch.zeros(shape, dtype=dtype)
        self.num_blocks = num_blocks
        self.block_size = block_size

    @property
    def num_slots(self) -> int:
        return self.keys.shape[2]


@dataclass(slots=True)
class PrefillSlice:
    """One multi-token chunk: rows query_start .. query_start+query_len of the step, attending to
    the sequence's first context_len tokens (cached ones plus the chunk itself), which live in
    context_blocks."""

    query_start: int
    query_len: int
    context_len: int
    context_blocks: torch.Tensor  # [blocks_needed(context_len)] int64
    query_positions: torch.Tensor  # [query_len] int64


@dataclass(slots=True)
class AttentionMetadata:
    """Everything attention needs for one step, built once by the runner.

    positions / slot_mapping: [num_tokens] position and cache slot of each token fed this step.
    logits_indices: [num_sampled] rows whose next-token logits are wanted.
    For the kernel (kernel_isa set): block_tables [chunks, max_blocks] int32, one row per chunk,
    and token_seq [num_tokens] int32, the row of each token.
    For torch's ops: decode_rows [batch] rows that are single-token queries; decode_blocks
    [batch, max_blocks] their block tables (padded with block 0, masked out); decode_positions
    [batch] their positions; prefills the multi-token chunks.
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    logits_indices: torch.Tensor
    kernel_isa: str | None = None
    kv_rows: torch.Tensor | None = None  # rows whose keys and values this rank stores; None: all
    dcp: DcpStep | None = None  # decode context parallelism, when the TP group splits the KV tokens
    block_tables: torch.Tensor | None = None
    token_seq: torch.Tensor | None = None
    decode_rows: torch.Tensor | None = None
    decode_blocks: torch.Tensor | None = None
    decode_positions: torch.Tensor | None = None
    prefills: list[PrefillSlice] = field(default_factory=list)
    _decode_masks: dict[int | None, torch.Tensor] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    @property
    def fused_step(self) -> bool:
        """Whether a fused decoder layer (engines/model/fused.py) may run this step: on the
        kernels, every key and value stored here, no context-parallel exchange."""
        return self.kernel_isa is not None and self.kv_rows is None and self.dcp is None

    def decode_mask(self, sliding_window: int | None, width: int) -> torch.Tensor:
        """[1, batch, 1, max_context] True where a decode query may see the key; cached per window
        size because every layer of that kind reuses it."""
        if sliding_window not in self._decode_masks:
            key_positions = torch.arange(width)[None, :]
            query_positions = self.decode_positions[:, None]
            visible = key_positions <= query_positions
            if sliding_window is not None:
                visible &= query_positions - key_positions < sliding_window
            self._decode_masks[sliding_window] = visible[None, :, None, :]
        return self._decode_masks[sliding_window]


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    layer_index: int,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Store k/v in the cache and attend. q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim]
    (position encoding already applied). Returns [tokens, heads * dim] in q's dtype.

    A query at position p sees its sequence's keys at positions <= p, and with a sliding window
    only those with p - key_position < sliding_window.
    """
    num_tokens, num_heads, head_dim = q.shape
    keys, values = cache.keys[layer_index], cache.values[layer_index]
    if meta.kv_rows is not None:  # with DCP a rank stores only the positions it holds
        k, v = k[meta.kv_rows], v[meta.kv_rows]
    keys.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    values.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    if meta.dcp is not None:
        return _attend_context_parallel(q, keys, values, cache, meta, scale, sliding_window)
    if meta.kernel_isa is not None:
        out = kernels.attention(
            q.contiguous(), keys, values, meta.block_tables, meta.token_seq, meta.positions,
            cache.block_size, scale, sliding_window, meta.kernel_isa,
        )  # fmt: skip
        return out.reshape(num_tokens, num_heads * head_dim)
    if num_tokens == meta.decode_rows.shape[0]:  # a decode-only step: no scatter needed
        return _decode(q, keys, values, meta, cache.block_size, scale, sliding_window).reshape(
            num_tokens, num_heads * head_dim
        )
    out = torch.empty_like(q)
    if meta.decode_rows.numel():
        out[meta.decode_rows] = _decode(
            q[meta.decode_rows], keys, values, meta, cache.block_size, scale, sliding_window
        )
    for chunk in meta.prefills:
        rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
        out[rows] = _prefill(q[rows], keys, values, chunk, cache.block_size, scale, sliding_window)
    return out.reshape(num_tokens, num_heads * head_dim)


@dataclass(frozen=True, slots=True)
class DcpStep:
    """A rank's place in its decode-context-parallel group, and the group's exchange."""

    exchange: ContextExchange
    dcp_size: int
    dcp_rank: int
    interleave: int


def _attend_context_parallel(q, keys, values, cache: KVCache, meta: AttentionMetadata, scale, sliding_window):
    """DESIGN.md's DCP attention: gather the group's queries, attend over this rank's keys with
    all the group's heads (output and LSE), exchange the partials and combine this rank's heads."""
    num_tokens, num_heads, head_dim = q.shape
    dcp = meta.dcp
    group_q = dcp.exchange.gather_queries(q.float())
    if q.dtype != torch.float32:
        group_q = group_q.to(q.dtype)
    partial, lse = kernels.attention_shard(
        group_q.contiguous(), keys, values, meta.block_tables, meta.token_seq, meta.positions, cache.block_size,
        scale, sliding_window, dcp.dcp_size, dcp.dcp_rank, dcp.interleave, meta.kernel_isa,
    )  # fmt: skip
    out = dcp.exchange.combine_partials(partial.float(), lse, meta.kernel_isa)
    return out.to(q.dtype).reshape(num_tokens, num_heads * head_dim)


def _gather_blocks(cache: torch.Tensor, blocks: torch.Tensor, block_size: int) -> torch.Tensor:
    """cache [kv_heads, slots, dim], blocks [..., n] -> [kv_heads, ..., n * block_size, dim]: whole
    blocks are copied, which is far cheaper than indexing token by token."""
    num_kv_heads, num_slots, head_dim = cache.shape
    gathered = cache.view(num_kv_heads, num_slots // block_size, block_size, head_dim)[:, blocks]
    return gathered.reshape(num_kv_heads, *blocks.shape[:-1], blocks.shape[-1] * block_size, head_dim)


def _decode(
    q, keys, values, meta: AttentionMetadata, block_size: int, scale: float, sliding_window: int | None
) -> torch.Tensor:
    """Single-token queries of a batch: q [batch, heads, dim] -> [batch, heads, dim]. The query
    heads sharing a kv head are stacked as rows, so kv heads are never repeated. The math runs in
    float32: the batch pads every context to the longest, and bfloat16 sums over a padded length
    round differently enough to flip near-tied tokens between a request alone and in a batch."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[0]
    context_keys = _gather_blocks(keys, meta.decode_blocks, block_size).float()  # [kv_heads, batch, ctx, dim]
    context_values = _gather_blocks(values, meta.decode_blocks, block_size).float()
    grouped = q.float().reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim).transpose(0, 1)
    scores = torch.matmul(grouped, context_keys.transpose(-1, -2)) * scale  # [kv_heads, batch, group, context]
    scores = scores.masked_fill(~meta.decode_mask(sliding_window, scores.shape[-1]), float("-inf"))
    out = torch.matmul(scores.softmax(-1), context_values)  # [kv_heads, batch, group, dim]
    return out.transpose(0, 1).reshape(batch, num_heads, head_dim).to(q.dtype)


def _prefill(
    q, keys, values, chunk: PrefillSlice, block_size: int, scale: float, sliding_window: int | None
) -> torch.Tensor:
    """One sequence's chunk: q [query_len, heads, dim] -> [query_len, heads, dim]."""
    first = 0
    if sliding_window is not None:
        first = max(0, int(chunk.query_positions[0]) - sliding_window + 1)
    context_keys = _gather_blocks(keys, chunk.context_blocks, block_size)[:, first : chunk.context_len]
    context_values = _gather_blocks(values, chunk.context_blocks, block_size)[:, first : chunk.context_len]
    key_positions = torch.arange(first, chunk.context_len)
    visible = key_positions[None, :] <= chunk.query_positions[:, None]
    if sliding_window is not None:
        visible &= chunk.query_positions[:, None] - key_positions[None, :] < sliding_window
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), context_keys, context_values, attn_mask=visible, scale=scale, enable_gqa=True
    )
    return out.transpose(0, 1)
