"""The tensor-parallel group's collectives, over torch.distributed with the gloo backend.

Every rank of one engine runs on one host; the group rendezvous through a TCPStore on 127.0.0.1
at a port rank 0 chose. Collectives keep batch invariance: a sum over ranks is an all-gather
followed by additions in rank order (gloo's own all-reduce may order its additions by chunk,
and chunks follow the tensor's size), so a row's result never depends on how many rows the step
had. Waiting for a step blocks in a broadcast with no timeout (an idle engine sends none); a rank
that dies breaks the group's connections, and rank 0's watchdog catches one that hangs.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

RENDEZVOUS_TIMEOUT = timedelta(seconds=120)
# Collectives wait as long as an idle engine may wait for its next step.
COLLECTIVE_TIMEOUT = timedelta(days=365)
HEADER_SIZE = 8


class TensorParallelGroup:
    def __init__(self, rank: int, size: int, port: int):
        self.rank, self.size = rank, size
        store = dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0, timeout=RENDEZVOUS_TIMEOUT)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT)
        self.header = torch.zeros(HEADER_SIZE, dtype=torch.int64)

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def sum_in_rank_order(self, partial: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of `partial` (same shape on each), added in rank order on every rank."""
        partial = partial.contiguous()
        parts = [torch.empty_like(partial) for _ in range(self.size)]
        dist.all_gather(parts, partial)
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total

    def gather_columns(self, local: torch.Tensor) -> torch.Tensor:
        """Every rank's `local` [rows, n] side by side in rank order, [rows, size * n], on every rank."""
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local)
        return torch.cat(parts, dim=1)

    def gather_columns_to_first(self, local: torch.Tensor) -> torch.Tensor:
        """Rank 0: every rank's `local` [rows, n] side by side, [rows, size * n]; others: `local`."""
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.size)] if self.is_first else None
        dist.gather(local, parts, dst=0)
        return torch.cat(parts, dim=1) if self.is_first else local

    def broadcast_header(self, values: list[int] | None = None) -> list[int]:
        """Rank 0 sends up to HEADER_SIZE ints (the next step's command and sizes); the others
        block until they arrive."""
        if values is not None:
            self.header.zero_()
            self.header[: len(values)] = torch.tensor(values, dtype=torch.int64)
        dist.broadcast(self.header, src=0)
        return self.header.tolist()

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
