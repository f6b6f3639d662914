"""Megatron-style tensor-parallel layers around a rank's shard of each linear layer.

The shards themselves are ordinary modules (nn.Linear, KernelLinear, Int8Linear) built from the
rank's slice of the checkpoint (engines/parallel/sharding.py); these wrappers say how a layer's
output joins the other ranks', with the collective in `forward`:
- column-parallel (qkv_proj, gate_up_proj): each rank computes its own output columns; no
  collective, the next layer reads them where they are;
- output-parallel (o_proj, down_proj, which Megatron splits by input): the input slices are
  gathered whole on every rank, each rank computes its rows of the hidden size, and the outputs
  are gathered side by side. Splitting these layers by input would make every output a sum of T
  partial sums, rounded differently from T = 1's one chain over k = 0..K-1; split by output, each
  output is that one chain, on one rank, so T ranks give T = 1's bits (greedy tokens and logprobs
  identical, which the e2e suite's greedy-identity gate checks for every topology). The price is
  a second gather per layer (the input's), of rows x K/T values per rank;
- vocabulary-parallel embedding: each rank looks up the ids in its rows (zeros elsewhere), and
  the lookups are added over ranks (exactly one is not zero);
- vocabulary-parallel lm_head: each rank computes its vocabulary rows' logits, gathered side by
  side on rank 0, which samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engines.model.config import ModelConfig
from engines.parallel.comm import TensorParallelGroup
from engines.parallel.plan import ParallelPlan


class ColumnParallelLinear(nn.Module):
    """This rank's output columns of a linear layer; the rest live on the other ranks."""

    def __init__(self, shard: nn.Module):
        super().__init__()
        self.shard = shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shard(x)


class OutputParallelLinear(nn.Module):
    """y = [x @ W_0.T, ..., x @ W_{T-1}.T], x gathered whole from the ranks' slices x_r and W_r
    this rank's output rows (all K columns)."""

    def __init__(self, shard: nn.Module, group: TensorParallelGroup):
        super().__init__()
        self.shard = shard
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.gather_columns(self.shard(self.group.gather_columns(x)))


def split_by_output(model: nn.Module, config: ModelConfig, plan: ParallelPlan) -> None:
    """Give a rank's shard-sized model (still on the meta device) o_proj and down_proj layers of
    its hidden rows over their whole input, the shapes engines/parallel/sharding.py loads."""
    rows = plan.hidden_rows(config)
    for layer in model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        attention.o_proj = nn.Linear(config.num_heads * config.head_dim, rows, bias=False, device="meta")
        mlp.down_proj = nn.Linear(config.intermediate_size, rows, bias=False, device="meta")


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
        attention.o_proj = OutputParallelLinear(attention.o_proj, group)
        mlp.gate_up_proj = ColumnParallelLinear(mlp.gate_up_proj)
        mlp.down_proj = OutputParallelLinear(mlp.down_proj, group)
