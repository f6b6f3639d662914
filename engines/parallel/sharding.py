"""A tensor-parallel rank's share of a checkpoint: the runner's parameter names, sliced.

Column-parallel layers (qkv_proj, gate_up_proj) keep their rows of this rank's heads and MLP
slice; o_proj and down_proj their rows of the hidden size, every column (their input is gathered
whole: engines/parallel/layers.py); the embedding and an untied
lm_head their vocabulary rows (the last rank's padded with zeros). Norms are replicated. Each
slice is copied out, so once the full checkpoint is dropped a rank holds only its share.
"""

from __future__ import annotations

import re

import torch

from engines.model.config import ModelConfig
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
