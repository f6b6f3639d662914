"""Attention over the engine's KV cache, shared by every model.

A model computes q, k and v for the step's tokens, applies its own position encoding, and calls
`attend`; where keys and values live (the cache layout) and which cached tokens each query may
see (causality, sliding windows) are decided here, from `AttentionMetadata`, and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class AttentionMetadata:
    """What one forward step attends to, for a single sequence.

    `start` tokens are already in the cache; the step adds `num_tokens` at positions
    start .. start+num_tokens-1 and each new token attends causally to all cached ones.
    """

    start: int
    num_tokens: int

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def positions(self) -> torch.Tensor:
        """Position of each of the step's tokens: [num_tokens] int64."""
        return torch.arange(self.start, self.end)

    @property
    def logits_indices(self) -> torch.Tensor:
        """Rows of the step's hidden states whose next-token logits are wanted: [num_sequences]."""
        return torch.tensor([self.num_tokens - 1])


class KVCache:
    """Contiguous key/value storage for one sequence: `keys[layer]` is [kv_heads, max_len, head_dim],
    laid out so the attended prefix is a view, never a copy."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int, dtype: torch.dtype):
        shape = (num_layers, num_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype)
        self.values = torch.zeros(shape, dtype=dtype)
        self.max_len = max_len


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

    A query at position p sees cached keys at positions <= p, and with a sliding window only
    those with p - key_position < sliding_window.
    """
    num_tokens, num_heads, head_dim = q.shape
    keys, values = cache.keys[layer_index], cache.values[layer_index]
    keys[:, meta.start : meta.end] = k.transpose(0, 1)
    values[:, meta.start : meta.end] = v.transpose(0, 1)
    first = 0 if sliding_window is None else max(0, meta.end - num_tokens - sliding_window + 1)
    keys, values = keys[:, first : meta.end], values[:, first : meta.end]
    q = q.transpose(0, 1)
    if num_tokens == 1:
        out = _single_query(q, keys, values, scale)
    else:
        key_positions = torch.arange(first, meta.end)
        visible = key_positions[None, :] <= meta.positions[:, None]
        if sliding_window is not None:
            visible &= meta.positions[:, None] - key_positions[None, :] < sliding_window
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=scale, enable_gqa=True)
    return out.transpose(0, 1).reshape(num_tokens, num_heads * head_dim)


def _single_query(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """One query token against the visible cache without repeating kv heads: the query heads that
    share a kv head are stacked as rows. q: [heads, 1, dim]; keys/values: [kv_heads, len, dim]."""
    num_heads, _, head_dim = q.shape
    num_kv_heads = keys.shape[0]
    grouped = q.reshape(num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.bmm(grouped, keys.transpose(1, 2)).float() * scale
    probs = scores.softmax(-1).to(values.dtype)
    return torch.bmm(probs, values).reshape(num_heads, 1, head_dim)
