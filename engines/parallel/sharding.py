"""A tensor-parallel rank's share of a checkpoint: the runner's parameter names, sliced.

Column-parallel layers (qkv_proj, gate_up_proj) keep their rows of this rank's heads and MLP
slice; o_proj and down_proj their rows of the hidden size, every column (their input is gathered
whole: engines/parallel/layers.py); the embedding and an untied
lm_head their vocabulary rows (the last rank's padded with zeros). Norms are replicated. Each
slice is copied out, so once the full checkpoint is dropped a rank holds only its share.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from engines.kernels.gguf_blocks import GroupQuantized
from engines.model.config import ModelConfig
from engines.model.weights import merge_alike
from engines.parallel.plan import ParallelPlan

_LAYER = re.compile(r"layers\.(\d+)\.(.+)")


def _rows(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return tensor[start:stop].clone()


def _vocabulary(tensor: torch.Tensor, plan: ParallelPlan, config: ModelConfig, rank: int) -> torch.Tensor:
    rows = plan.vocab_rows(config)
    share = tensor[rank * rows : (rank + 1) * rows]
    if share.shape[0] < rows:
        share = torch.cat([share, share.new_zeros(rows - share.shape[0], share.shape[1])])
    return share.clone()


def shard_state_dict(
    state: dict[str, torch.Tensor], config: ModelConfig, plan: ParallelPlan, rank: int
) -> dict[str, torch.Tensor]:
    """Rank `rank`'s tensors, under the same names, from the full `state`."""
    d = config.head_dim
    heads, kv_heads = plan.heads(config), plan.kv_heads(config)
    first_kv = plan.first_kv_head(config, rank)
    intermediate = config.intermediate_size // plan.tp_size
    hidden_rows = (rank * plan.hidden_rows(config), (rank + 1) * plan.hidden_rows(config))
    q_rows = (rank * heads * d, (rank + 1) * heads * d)
    k_start = config.q_size + first_kv * d
    v_start = config.q_size + config.kv_size + first_kv * d
    shard = {}
    for name, tensor in state.items():
        if name in ("embed_tokens.weight", "lm_head.weight"):
            shard[name] = _vocabulary(tensor, plan, config, rank)
            continue
        match = _LAYER.fullmatch(name)
        part = match[2] if match else name
        if part == "self_attn.qkv_proj.weight":
            shard[name] = torch.cat(
                [
                    _rows(tensor, *q_rows),
                    _rows(tensor, k_start, k_start + kv_heads * d),
                    _rows(tensor, v_start, v_start + kv_heads * d),
                ]
            )
        elif part in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            shard[name] = _rows(tensor, *hidden_rows)
        elif part == "mlp.gate_up_proj.weight":
            gate = _rows(tensor, rank * intermediate, (rank + 1) * intermediate)
            up_start = config.intermediate_size + rank * intermediate
            shard[name] = torch.cat([gate, _rows(tensor, up_start, up_start + intermediate)])
        else:  # norms (and q/k norms of Gemma): every rank holds them whole
            shard[name] = tensor
    return shard


def shard_blocks(
    weights: dict[str, list[GroupQuantized]], config: ModelConfig, plan: ParallelPlan, rank: int
) -> dict[str, list[GroupQuantized]]:
    """Rank `rank`'s share of a GGUF's quantized blocks (engines/model/weights.py's
    gguf_quantized_weights): exactly the rows shard_state_dict keeps of the dense weights, in the
    same order, padding rows all zeros. Whole rows only, so every kept row is the same integers
    and scales as on one rank, and a row-wise kernel gives it the same bits."""
    numbered = {  # row r of a weight as the number r + 1 (0 is what padding reads as)
        name: torch.arange(1, sum(p.shape[0] for p in parts) + 1, dtype=torch.float64)[:, None]
        for name, parts in weights.items()
    }
    kept = shard_state_dict(numbered, config, plan, rank)
    return {name: _take_rows(parts, kept[name][:, 0].long().numpy() - 1) for name, parts in weights.items()}


def _take_rows(parts: list[GroupQuantized], rows: np.ndarray) -> list[GroupQuantized]:
    """Rows `rows` (indices over the parts stacked, -1 for a zero row) as parts, merged where alike."""
    starts = np.cumsum([0] + [p.shape[0] for p in parts])
    owner = np.searchsorted(starts, rows, side="right") - 1  # the part holding each row; -1: padding
    owner[rows < 0] = -1
    taken: list[GroupQuantized] = []
    begin = 0
    while begin < len(rows):
        end = begin
        while end < len(rows) and owner[end] == owner[begin]:
            end += 1
        if owner[begin] >= 0:
            taken.append(parts[owner[begin]].rows(rows[begin:end] - starts[owner[begin]]))
        else:
            taken.append(_zero_rows(taken[-1] if taken else parts[-1], end - begin))
        begin = end
    return merge_alike(taken)


def _zero_rows(like: GroupQuantized, count: int) -> GroupQuantized:
    """`count` rows of weight 0 in `like`'s format (codes 0, scales 0, offsets 0)."""
    groups = like.shape[1] // like.group
    offsets = None if like.offsets is None else np.zeros((count, groups), np.float32)
    return GroupQuantized(
        np.zeros((count, like.shape[1]), like.codes.dtype), np.zeros((count, groups), np.float32), offsets,
        like.group, like.nibbles,
    )  # fmt: skip
