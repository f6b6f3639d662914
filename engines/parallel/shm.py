"""Named shared memory carved into typed tensors, allocated once when an engine starts.

The engine process (TP rank 0) creates an arena with a fresh random name and passes the name to
its workers, which attach to it. Once every rank has attached, rank 0 unlinks the name: the
mappings stay valid, and nothing is left in /dev/shm whatever way the processes end.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

import torch

ALIGN = 64  # bytes: every tensor starts on its own cache line


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def layout(specs: list[TensorSpec]) -> tuple[dict[str, int], int]:
    """Byte offset of each tensor and the arena's total size."""
    offsets, size = {}, 0
    for spec in specs:
        offsets[spec.name] = size
        numel = 1
        for dim in spec.shape:
            numel *= dim
        size += -(-numel * spec.dtype.itemsize // ALIGN) * ALIGN
    return offsets, max(size, ALIGN)


class SharedArena:
    """Tensors over one shared-memory segment; `tensors[name]` is a view, never a copy."""

    def __init__(self, specs: list[TensorSpec], name: str | None = None):
        offsets, size = layout(specs)
        self.specs = specs
        if name is None:
            self.memory = shared_memory.SharedMemory(name=f"dpgate-{secrets.token_hex(8)}", create=True, size=size)
            self.is_owner = True
        else:
            self.memory = shared_memory.SharedMemory(name=name)
            # Attaching registers the segment with this process's resource tracker, which would
            # unlink it when this process exits; the creator owns its lifetime.
            resource_tracker.unregister(self.memory._name, "shared_memory")
            self.is_owner = False
        self.tensors: dict[str, torch.Tensor] = {}
        for spec in specs:
            numel = 1
            for dim in spec.shape:
                numel *= dim
            view = torch.frombuffer(self.memory.buf, dtype=spec.dtype, count=numel, offset=offsets[spec.name])
            self.tensors[spec.name] = view.view(spec.shape)
        if self.is_owner:
            for tensor in self.tensors.values():
                tensor.zero_()

    @property
    def name(self) -> str:
        return self.memory.name

    def unlink(self) -> None:
        """Remove the name (creator only): attached processes keep their mappings."""
        if self.is_owner:
            with contextlib.suppress(FileNotFoundError):
                self.memory.unlink()
