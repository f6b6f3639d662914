"""Block accounting: every block is free or owned by exactly one table."""

from __future__ import annotations

import pytest

from engines.kv.block_manager import BlockManager, blocks_needed


def test_blocks_needed_rounds_up():
    assert [blocks_needed(n, 16) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]


def test_grow_and_free_account_for_every_block():
    manager = BlockManager(num_blocks=4, block_size=16)
    a, b = [], []
    manager.grow(a, 17)
    manager.grow(b, 16)
    assert (len(a), len(b), manager.num_free_blocks) == (2, 1, 1)
    manager.check_invariants([a, b])
    assert manager.usage == 0.75
    assert manager.can_grow(a, 48) and not manager.can_grow(a, 49)
    manager.free(a)
    assert a == [] and manager.num_free_blocks == 3
    manager.check_invariants([a, b])


def test_growing_past_the_free_blocks_raises_without_taking_any():
    manager = BlockManager(num_blocks=2, block_size=4)
    table: list[int] = []
    with pytest.raises(RuntimeError):
        manager.grow(table, 9)
    assert table == [] and manager.num_free_blocks == 2


def test_invariants_catch_a_block_owned_twice():
    manager = BlockManager(num_blocks=2, block_size=4)
    a: list[int] = []
    manager.grow(a, 4)
    with pytest.raises(AssertionError):
        manager.check_invariants([a, list(a)])
