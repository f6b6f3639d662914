"""The typed step record rank 0 writes once per step into shared memory for its workers.

A step's inputs are a few flat arrays (`StepInputs`); rank 0 copies them into fixed-size
shared-memory tensors and broadcasts a small header (command, epoch and the arrays' lengths)
over the TP group. Workers wake on the header and read the arrays where they are: no pickle,
no per-step allocation of the record. The record's bounds are set at start from the engine's
limits and asserted in `write`, the path that fills it.
"""

from __future__ import annotations

import enum

import torch

from engines.model.step_inputs import StepInputs
from engines.parallel.comm import TensorParallelGroup
from engines.parallel.shm import SharedArena, TensorSpec


class Command(enum.IntEnum):
    STEP = 1
    SHUTDOWN = 2


def record_specs(max_tokens: int, max_chunks: int, max_blocks: int) -> list[TensorSpec]:
    return [
        TensorSpec("token_ids", (max_tokens,), torch.int64),
        TensorSpec("positions", (max_tokens,), torch.int64),
        TensorSpec("token_seq", (max_tokens,), torch.int32),
        TensorSpec("block_tables", (max_chunks * max_blocks,), torch.int32),
        TensorSpec("logits_indices", (max_chunks,), torch.int64),
        TensorSpec("score_indices", (max_tokens,), torch.int64),
        TensorSpec("chunk_spans", (2 * max_chunks,), torch.int64),  # starts, then lengths
    ]


class StepRecord:
    def __init__(self, arena: SharedArena, group: TensorParallelGroup):
        self.arena, self.group = arena, group
        self.tensors = arena.tensors
        self.max_tokens = self.tensors["token_ids"].shape[0]
        self.max_chunks = self.tensors["logits_indices"].shape[0]
        self.max_table = self.tensors["block_tables"].shape[0]
        self.epoch = 0

    def write(self, inputs: StepInputs) -> None:
        """Rank 0: publish the step and wake the workers."""
        n, (chunks, width), k = inputs.num_tokens, inputs.block_tables.shape, inputs.logits_indices.shape[0]
        assert n <= self.max_tokens, f"{n} tokens exceed the step record ({self.max_tokens})"
        assert chunks <= self.max_chunks and chunks * width <= self.max_table, "block tables exceed the step record"
        assert k <= self.max_chunks, "more sampled rows than the step record holds"
        s = inputs.score_indices.shape[0]
        assert s <= self.max_tokens, "more scored rows than the step record holds"
        t = self.tensors
        t["token_ids"][:n].copy_(inputs.token_ids)
        t["positions"][:n].copy_(inputs.positions)
        t["token_seq"][:n].copy_(inputs.token_seq)
        t["block_tables"][: chunks * width].copy_(inputs.block_tables.reshape(-1))
        t["logits_indices"][:k].copy_(inputs.logits_indices)
        t["score_indices"][:s].copy_(inputs.score_indices)
        t["chunk_spans"][: 2 * chunks] = torch.tensor(inputs.chunk_starts + inputs.chunk_lengths, dtype=torch.int64)
        self.epoch += 1
        self.group.broadcast_header([Command.STEP, self.epoch, n, chunks, width, k, s])

    def shutdown(self) -> None:
        self.group.broadcast_header([Command.SHUTDOWN, self.epoch])

    def read(self) -> StepInputs | None:
        """Workers: wait for the next step; None means shut down. The tensors are views of the
        record, valid until rank 0 writes the next step (which it does only after this one ran)."""
        command, epoch, n, chunks, width, k, s, *_ = self.group.broadcast_header()
        if command == Command.SHUTDOWN:
            return None
        self.epoch = epoch
        t = self.tensors
        spans = t["chunk_spans"][: 2 * chunks].tolist()
        return StepInputs(
            token_ids=t["token_ids"][:n],
            positions=t["positions"][:n],
            token_seq=t["token_seq"][:n],
            block_tables=t["block_tables"][: chunks * width].view(chunks, width),
            logits_indices=t["logits_indices"][:k],
            score_indices=t["score_indices"][:s],
            chunk_starts=tuple(spans[:chunks]),
            chunk_lengths=tuple(spans[chunks:]),
        )
