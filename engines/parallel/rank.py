"""Everything one tensor-parallel rank of an engine shares with the others, built once at start.

`RankContext` is what the runner needs (its plan and rank, the TP group, the step record, its
DCP group's exchange); `ParallelBuffers` describes the shared memory rank 0 allocates for all of
them and passes to each worker by name, together with its sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from engines.kv.attention import DcpStep
from engines.model.config import ModelConfig
from engines.parallel.comm import TensorParallelGroup
from engines.parallel.dcp_exchange import DcpExchange, exchange_specs
from engines.parallel.plan import ParallelPlan
from engines.parallel.shm import SharedArena, TensorSpec
from engines.parallel.step_record import StepRecord, record_specs

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BufferSizes:
    """The bounds every shared buffer is allocated with, fixed at start."""

    max_tokens: int  # tokens per step (the scheduler's budget, or more for warm-up)
    max_chunks: int  # sequences per step
    max_blocks: int  # block-table width
    workspace_tokens: int  # DCP exchange rows: max_tokens rounded up to lcm(block_size, C * I)
    local_heads: int
    head_dim: int


def buffer_sizes(plan: ParallelPlan, config: ModelConfig, max_tokens: int, max_chunks: int, num_blocks: int,
                 block_size: int) -> BufferSizes:  # fmt: skip
    return BufferSizes(
        max_tokens=max_tokens,
        max_chunks=max_chunks,
        max_blocks=num_blocks,
        workspace_tokens=plan.workspace_tokens(max_tokens, block_size),
        local_heads=plan.heads(config),
        head_dim=config.head_dim,
    )


def heartbeat_specs(tp_size: int) -> list[TensorSpec]:
    """One counter per rank: the last step it finished (rank 0's watchdog names a laggard)."""
    return [TensorSpec("finished_steps", (tp_size, 8), torch.int64)]


@dataclass(frozen=True, slots=True)
class SharedNames:
    """Names of the shared-memory arenas rank 0 created: the step record, the heartbeats and one
    exchange per DCP group (empty without DCP)."""

    record: str
    heartbeats: str
    exchanges: tuple[str, ...]


def create_buffers(plan: ParallelPlan, sizes: BufferSizes) -> tuple[SharedArena, SharedArena, list[SharedArena]]:
    record = SharedArena(record_specs(sizes.max_tokens, sizes.max_chunks, sizes.max_blocks))
    heartbeats = SharedArena(heartbeat_specs(plan.tp_size))
    exchanges = []
    if plan.dcp_size > 1:
        specs = exchange_specs(plan.dcp_size, sizes.workspace_tokens, sizes.local_heads, sizes.head_dim)
        exchanges = [SharedArena(specs) for _ in range(plan.tp_size // plan.dcp_size)]
    return record, heartbeats, exchanges


@dataclass(slots=True)
class RankContext:
    plan: ParallelPlan
    rank: int
    group: TensorParallelGroup
    record: StepRecord
    heartbeats: torch.Tensor  # [tp_size, 8] int64: column 0 is the last step each rank finished
    exchange: DcpExchange | None
    arenas: tuple[SharedArena, ...]  # held so the mappings the tensors above view stay alive
    watchdog: Callable[[Callable[[], T]], T] | None = None  # rank 0: runs a step under a deadline

    @property
    def dcp_rank(self) -> int:
        return self.plan.dcp_rank(self.rank)

    def step(self, run: Callable[[], T]) -> T:
        return self.watchdog(run) if self.watchdog is not None else run()

    def dcp_step(self) -> DcpStep:
        assert self.exchange is not None  # our invariant: only called with DCP
        return DcpStep(self.exchange, self.plan.dcp_size, self.dcp_rank, self.plan.interleave)


def attach_context(
    plan: ParallelPlan, rank: int, group: TensorParallelGroup, names: SharedNames, sizes: BufferSizes,
    arenas: tuple[SharedArena, SharedArena, list[SharedArena]] | None = None,
) -> RankContext:  # fmt: skip
    """The context of `rank`: rank 0 passes the arenas it created, workers attach by name."""
    if arenas is None:
        record = SharedArena(record_specs(sizes.max_tokens, sizes.max_chunks, sizes.max_blocks), names.record)
        heartbeats = SharedArena(heartbeat_specs(plan.tp_size), names.heartbeats)
        specs = exchange_specs(plan.dcp_size, sizes.workspace_tokens, sizes.local_heads, sizes.head_dim)
        exchanges = [SharedArena(specs, name) for name in names.exchanges]
    else:
        record, heartbeats, exchanges = arenas
    exchange = None
    if plan.dcp_size > 1:
        exchange = DcpExchange(exchanges[rank // plan.dcp_size], plan.dcp_size, plan.dcp_rank(rank))
    return RankContext(
        plan, rank, group, StepRecord(record, group), heartbeats.tensors["finished_steps"], exchange,
        (record, heartbeats, *exchanges),
    )  # fmt: skip
