"""The chain cache gives `block_chain`'s hashes for prompts made of pieces, whether their prefixes
were hashed before or not: shared and diverging prefixes, every block size and piece length,
special ids before and after the pieces, tenants and salts, and after evictions."""

from __future__ import annotations

import random
from array import array

from gateway.bounded_lru import BoundedLru
from gateway.routing.block_hashes import block_chain
from gateway.routing.chain_cache import ChainCache

ROOT = 0x1234_5678_9ABC_DEF0


def piece_ids(piece: str) -> array:
    """A piece's ids depend on its text alone, as a tokenizer's do."""
    rng = random.Random(piece)
    return array("I", (rng.randrange(1 << 17) for _ in range(rng.randrange(0, 40))))


def prompt(pieces: list[str], prefix: tuple[int, ...], suffix: tuple[int, ...]) -> array:
    ids = array("I", prefix)
    for piece in pieces:
        ids += piece_ids(piece)
    ids.extend(suffix)
    return ids


def test_chains_equal_block_chain_for_prompts_sharing_prefixes_in_any_order():
    rng = random.Random(7)
    vocabulary = [f"p{i}" for i in range(12)]
    for entries in (1 << 20, 7):  # plenty of room, then evicting all the time
        cache = ChainCache(BoundedLru(max_entries=entries))
        for _ in range(400):
            pieces = [rng.choice(vocabulary[:4]) for _ in range(rng.randrange(0, 3))]  # shared openings
            pieces += [rng.choice(vocabulary) for _ in range(rng.randrange(0, 8))]
            prefix = rng.choice([(), (2,), (2, 5)])
            suffix = rng.choice([(), (1,), (3, 4, 9)])
            size = rng.choice([1, 3, 16])
            tenant, salt = rng.choice(["", "a"]), rng.choice(["", "s", "東京"])
            ids = prompt(pieces, prefix, suffix)
            got = cache.block_chain(ids, pieces, [piece_ids(p) for p in pieces], prefix, ROOT, size, tenant, salt)
            assert got == block_chain(ids, ROOT, size, tenant, salt), (pieces, prefix, suffix, size)
        assert len(cache) <= entries


def test_a_repeated_prompt_is_answered_from_its_nodes():
    cache = ChainCache()
    pieces = [f"piece {i}" for i in range(20)]
    ids = prompt(pieces, (), ())
    first = cache.block_chain(ids, pieces, [piece_ids(p) for p in pieces], (), ROOT, 4)
    nodes = len(cache)
    assert cache.block_chain(ids, pieces, [piece_ids(p) for p in pieces], (), ROOT, 4) == first
    assert len(cache) == nodes == 21  # the context and one node per piece, none added again
    other_salt = cache.block_chain(ids, pieces, [piece_ids(p) for p in pieces], (), ROOT, 4, "", "s")
    assert other_salt != first and len(cache) == 2 * nodes  # a salt is its own context
