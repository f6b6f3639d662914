"""The decode-context-parallel exchange: persistent shared-memory slots with epoch-parity signals.

Each layer of each step, the C ranks of a DCP group exchange twice: their query heads (every
rank attends with the whole group's heads over its own keys), then their partial outputs and
LSEs (each rank combines its own heads). Every exchange is one epoch, counted identically by all
ranks because they run the same steps in lockstep.

Synchronisation (DESIGN.md): rank d writes epoch e's payload into its slot e & 1, then stores e
into its signal for that slot (release). A reader waits until the sender's signal equals e
(acquire), so it never takes epoch e - 2's data, left in the same slot, for e's. A slot is
rewritten only two epochs later, and by then every reader is done with it: a rank writes e + 2
only after it has read everyone's e + 1, which each rank published after reading e.

An empty shard sends no payload: a rank with no keys for a query row writes LSE -inf for it and
leaves that row of its output slot as it was; the combine (dcp_combine) reads only rows with a
finite LSE, so whatever the slot held (NaN in the tests) never leaks in.

All buffers are allocated once, at start, with `workspace_tokens` rows (max tokens per step
rounded up to lcm(block_size, C * I)); nothing is allocated per step. Each buffer's bound is
asserted in `publish_*`, the path that writes it.
"""

from __future__ import annotations

import torch

from engines import kernels
from engines.parallel.shm import SharedArena, TensorSpec

SIGNAL_STRIDE = 8  # int64s per signal: one cache line each, so ranks do not share lines
DEFAULT_TIMEOUT_S = 60.0


class ExchangeTimeout(RuntimeError):
    """A DCP peer did not publish in time (it died or hangs); names the rank."""


def exchange_specs(dcp_size: int, workspace_tokens: int, local_heads: int, head_dim: int) -> list[TensorSpec]:
    group_heads = dcp_size * local_heads
    slots = (2, dcp_size)  # parity first, so one slot's buffers of all ranks are contiguous
    return [
        TensorSpec("query_signals", (dcp_size, 2, SIGNAL_STRIDE), torch.int64),
        TensorSpec("partial_signals", (dcp_size, 2, SIGNAL_STRIDE), torch.int64),
        TensorSpec("queries", (*slots, workspace_tokens, local_heads, head_dim), torch.float32),
        TensorSpec("outputs", (*slots, workspace_tokens, group_heads, head_dim), torch.float32),
        TensorSpec("lses", (*slots, workspace_tokens, group_heads), torch.float32),
    ]


class DcpExchange:
    """One DCP group's exchange, seen from rank `dcp_rank` of it."""

    def __init__(self, arena: SharedArena, dcp_size: int, dcp_rank: int, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.arena = arena
        self.dcp_size, self.dcp_rank = dcp_size, dcp_rank
        self.timeout_s = timeout_s
        t = arena.tensors
        self.query_signals = t["query_signals"].view(-1)
        self.partial_signals = t["partial_signals"].view(-1)
        self.queries, self.outputs, self.lses = t["queries"], t["outputs"], t["lses"]
        self.workspace_tokens, self.local_heads = self.queries.shape[2], self.queries.shape[3]
        self.epoch = 0
        # The group's gathered queries, [tokens, C * local heads, D]: allocated once, like the slots.
        self.gathered = torch.empty(self.workspace_tokens, dcp_size * self.local_heads, self.queries.shape[4])

    def _signal_index(self, rank: int, slot: int) -> int:
        return (rank * 2 + slot) * SIGNAL_STRIDE  # signals are [rank, slot, SIGNAL_STRIDE]

    def _wait_all(self, signals: torch.Tensor, epoch: int, what: str) -> None:
        slot = epoch & 1
        missing = kernels.signal_wait_all(
            signals, self._signal_index(0, slot), 2 * SIGNAL_STRIDE, self.dcp_size, epoch, self.timeout_s
        )
        if missing >= 0:
            raise ExchangeTimeout(
                f"decode context parallel rank {missing} did not publish its {what} for exchange {epoch} "
                f"within {self.timeout_s:.0f} s"
            )

    def gather_queries(self, q: torch.Tensor) -> torch.Tensor:
        """q [tokens, local heads, D] float32 -> the group's [tokens, C * local heads, D], ordered by
        DCP rank (the heads of consecutive ranks are consecutive global heads)."""
        num_tokens, heads, head_dim = q.shape
        assert num_tokens <= self.workspace_tokens, f"{num_tokens} tokens exceed the DCP workspace"
        self.epoch += 1
        slot = self.epoch & 1
        self.queries[slot, self.dcp_rank, :num_tokens].copy_(q)
        kernels.signal_store(self.query_signals, self._signal_index(self.dcp_rank, slot), self.epoch)
        self._wait_all(self.query_signals, self.epoch, "queries")
        gathered = self.gathered[:num_tokens].view(num_tokens, self.dcp_size, heads, head_dim)
        gathered.copy_(self.queries[slot, :, :num_tokens].transpose(0, 1))
        return gathered.view(num_tokens, self.dcp_size * heads, head_dim)

    def combine_partials(self, out: torch.Tensor, lse: torch.Tensor, isa: str) -> torch.Tensor:
        """This rank's partial attention for the group's heads (out [tokens, C * local heads, D],
        lse [tokens, C * local heads]) -> the combined output of its own heads [tokens, local heads, D]."""
        num_tokens = out.shape[0]
        assert num_tokens <= self.workspace_tokens, f"{num_tokens} tokens exceed the DCP workspace"
        self.epoch += 1
        slot = self.epoch & 1
        # Rows without keys (LSE -inf) send no payload: their slot rows keep what they held.
        kernels.dcp_publish(out, lse, self.outputs[slot, self.dcp_rank], self.lses[slot, self.dcp_rank])
        kernels.signal_store(self.partial_signals, self._signal_index(self.dcp_rank, slot), self.epoch)
        self._wait_all(self.partial_signals, self.epoch, "partial attention")
        combined, _ = kernels.dcp_combine(
            self.outputs[slot], self.lses[slot], num_tokens, self.dcp_rank * self.local_heads,
            self.local_heads, isa,
        )  # fmt: skip
        return combined
