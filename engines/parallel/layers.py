"""Megatron-style tensor-parallel layers around a rank's shard of each linear layer.

The shards themselves are ordinary modules (nn.Linear, KernelLinear, Int8Linear) built from the
rank's slice of the checkpoint (engines/parallel/sharding.py); these wrappers say how a layer's
output joins the other ranks', with the collective in `forward`:
- column-parallel (qkv_proj, gate_up_proj): each rank computes its own output columns; no
  collective, the next layer reads them where they are;
- row-parallel (o_proj, down_proj): each rank multiplies its input slice by its weight columns,
  and the partial sums are added over ranks;
- vocabulary-parallel embedding: each rank looks up the ids in its rows (zeros elsewhere), and
  the lookups are added over ranks (exactly one is not zero);
- vocabulary-parallel lm_head: each rank computes its vocabulary rows' logits, gathered side by
  side on rank 0, which samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engines.parallel.comm import TensorParallelGroup


class ColumnParallelLinear(nn.Module):
    """This rank's output columns of a linear layer; the rest live on the other ranks."""

    def __init__(self, shard: nn.Module):
        super().__init__()
        self.shard = shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shard(x)


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x_r @ W_r.T, x_r this rank's slice of the input."""

    def __init__(self, shard: nn.Module, group: TensorParallelGroup):
        super().__init__()
        self.shard = shard
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.sum_in_rank_order(self.shard(x))


class VocabParallelEmbedding(nn.Module):
    """Rows [first_id, first_id + rows) of the embedding here; the lookup sums over ranks."""

    def __init__(self, shard: nn.Embedding, first_id: int, group: TensorParallelGroup):
        super().__init__()
        self.weight = shard.weight
        self.first_id, self.num_rows = first_id, shard.weight.shape[0]
        self.group = group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.first_id
        here = (local >= 0) & (local < self.num_rows)
        rows = F.embedding(local.clamp(0, self.num_rows - 1), self.weight)
        return self.group.sum_in_rank_order(rows * here[:, None].to(rows.dtype))


class VocabParallelHead(nn.Module):
    """This rank's vocabulary rows of the logits, gathered on rank 0 into the whole vocabulary.
    Other ranks get an empty [rows, 0]: only rank 0 samples."""

    def __init__(self, shard: nn.Module, vocab_size: int, group: TensorParallelGroup):
        super().__init__()
        self.shard = shard
        self.vocab_size = vocab_size
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.group.gather_columns_to_first(self.shard(x).float())
        return logits[:, : self.vocab_size] if self.group.is_first else logits[:, :0]


def use_tensor_parallel(model: nn.Module, vocab_size: int, first_vocab_id: int, group: TensorParallelGroup) -> None:
    """Wrap a rank's shard-sized model (Llama or Gemma 3) in the parallel layers, in place."""
    model.embed_tokens = VocabParallelEmbedding(model.embed_tokens, first_vocab_id, group)
    model.lm_head = VocabParallelHead(model.lm_head, vocab_size, group)
    for layer in model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        attention.qkv_proj = ColumnParallelLinear(attention.qkv_proj)
        attention.o_proj = RowParallelLinear(attention.o_proj, group)
        mlp.gate_up_proj = ColumnParallelLinear(mlp.gate_up_proj)
        mlp.down_proj = RowParallelLinear(mlp.down_proj, group)
