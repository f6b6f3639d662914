"""Owns the paged KV cache's blocks: which are free, which belong to which sequence.

Pure bookkeeping, no torch: a block is an index into the runner's cache tensors. Every block is
always either on the free list or in exactly one sequence's block table; `check_invariants`
proves it and tests call it after every step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return 1.0 - len(self.free_blocks) / self.num_blocks

    def num_missing_blocks(self, block_table: list[int], num_tokens: int) -> int:
        """Blocks to add so `block_table` holds `num_tokens` tokens."""
        return max(0, blocks_needed(num_tokens, self.block_size) - len(block_table))

    def can_grow(self, block_table: list[int], num_tokens: int) -> bool:
        return self.num_missing_blocks(block_table, num_tokens) <= len(self.free_blocks)

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        """Append free blocks to `block_table` until it holds `num_tokens` tokens."""
        missing = self.num_missing_blocks(block_table, num_tokens)
        if missing > len(self.free_blocks):
            raise RuntimeError(f"grow needs {missing} blocks but {len(self.free_blocks)} are free")
        block_table.extend(self.free_blocks.popleft() for _ in range(missing))

    def free(self, block_table: list[int]) -> None:
        """Return the table's blocks to the free list and empty the table."""
        self.free_blocks.extend(block_table)
        block_table.clear()

    def check_invariants(self, block_tables: Iterable[list[int]]) -> None:
        """Every block is free or owned by exactly one table (raises AssertionError otherwise)."""
        owned = [block for table in block_tables for block in table]
        everything = owned + list(self.free_blocks)
        assert len(everything) == self.num_blocks, f"{len(everything)} blocks accounted of {self.num_blocks}"
        assert set(everything) == set(range(self.num_blocks)), "a block is lost or owned twice"
