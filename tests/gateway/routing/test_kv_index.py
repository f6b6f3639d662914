"""The exact index against a plain model of it (a dict of sets per engine) through random edits."""

from __future__ import annotations

import random

from gateway.routing.kv_index import KvIndex


def check_consistent(index: KvIndex, model: dict[str, set[int]]) -> None:
    for address, blocks in model.items():
        assert index.blocks_of(address) == blocks
    every = set().union(*model.values()) if model else set()
    for block_hash in every | {999_999}:
        assert index.holders(block_hash) == {a for a, blocks in model.items() if block_hash in blocks}
    assert sorted(index.addresses()) == sorted(model)


def test_random_snapshots_events_and_drops_match_a_plain_model():
    rng = random.Random(3)
    index, model = KvIndex(), {}
    engines = ["a:1", "b:2", "c:3"]
    for _ in range(3000):
        address, op = rng.choice(engines), rng.random()
        block_hash = rng.randrange(40)
        if op < 0.05:
            blocks = {rng.randrange(40) for _ in range(rng.randrange(10))}
            index.replace(address, blocks)
            model[address] = set(blocks)
        elif op < 0.07:
            index.drop(address)
            model.pop(address, None)
        elif op < 0.09:
            index.clear(address)
            model[address] = set()
        elif op < 0.6:
            index.add(address, block_hash)
            model.setdefault(address, set()).add(block_hash)
        else:
            index.remove(address, block_hash)  # removing an unknown block or engine is a no-op
            if address in model:
                model[address].discard(block_hash)
        check_consistent(index, model)


def test_matched_blocks_counts_leading_blocks_only():
    index = KvIndex()
    index.replace("a", [1, 2, 3])
    index.replace("b", [1, 3])  # holds block 3 past a gap: worth nothing
    index.replace("c", [2, 3])  # lacks the first block: nothing
    assert index.matched_blocks([1, 2, 3, 4]) == {"a": 3, "b": 1}
    assert index.matched_blocks([7, 1]) == {}
    assert index.matched_blocks([]) == {}
