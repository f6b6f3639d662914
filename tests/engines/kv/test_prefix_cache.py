"""The block manager's prefix cache on plain data: hits, confirmation, references, LRU, events."""

from __future__ import annotations

import hashlib
import random
import struct

from engines.kv.block_manager import (
    AllBlocksCleared,
    BlockManager,
    BlockRemoved,
    BlockStored,
    PrefixHit,
    PrefixState,
)
from engines.kv.prefix_hash import block_hash, extra_keys, root_hash


def cached(manager: BlockManager, tokens: list[int], extra: bytes = b"") -> tuple[list[int], PrefixState]:
    """Admit `tokens` as a sequence would: take its hit, grow, compute all, register."""
    state, table = PrefixState(extra=extra), []
    hit = manager.match_prefix(state, tokens)
    manager.take(hit, state, table, len(tokens))
    manager.grow(table, len(tokens))
    manager.cache_blocks(state, table, len(tokens), lambda: tokens)
    return table, state


def test_the_hash_is_the_documented_bytes():
    extra = extra_keys("tenant", "salt")
    assert extra == b"\x06\x00\x00\x00tenant\x04\x00\x00\x00salt"
    parent = root_hash(b"fp")
    assert parent == int.from_bytes(hashlib.sha256(b"dpgate-kv-root-v1fp").digest()[:8], "little")
    data = parent.to_bytes(8, "little") + len(extra).to_bytes(4, "little") + extra
    data += b"".join(t.to_bytes(4, "little") for t in (1, 2, 70000))
    assert block_hash(parent, extra, [1, 2, 70000]) == int.from_bytes(hashlib.sha256(data).digest()[:8], "little")
    assert struct.pack("<Q", block_hash(parent, b"", [5])) != struct.pack("<Q", block_hash(parent, b"", [6]))


def test_a_salt_never_stands_in_for_a_tenant():
    assert extra_keys("ab", "") != extra_keys("a", "b") != extra_keys("", "ab")


def test_a_second_sequence_shares_the_first_ones_full_blocks_but_not_its_last_token():
    manager = BlockManager(8, 4, enable_caching=True)
    tokens = list(range(10))
    first, _ = cached(manager, tokens)
    state = PrefixState()
    hit = manager.match_prefix(state, tokens)
    assert hit.blocks == tuple(first[:2])  # 8 of 10 tokens; block 2 is not full
    exact = list(range(8))  # whole blocks only: the last block still leaves its last token to compute
    assert manager.match_prefix(PrefixState(), exact).blocks == (first[0],)
    second: list[int] = []
    assert manager.take(hit, state, second, len(tokens)) == 8
    assert manager.ref_counts[first[0]] == 2
    manager.check_invariants([first, second])


def test_unreferenced_cached_blocks_wait_in_the_lru_and_are_evicted_tail_first():
    manager = BlockManager(4, 2, enable_caching=True)
    table, _ = cached(manager, [1, 2, 3, 4, 5])  # 3 blocks, 2 full and registered
    manager.free(table)
    assert manager.num_free_blocks == 4 and manager.num_cached_free_blocks == 2 and manager.usage == 0.0
    other: list[int] = []
    manager.grow(other, 6)  # the two truly free blocks, then the LRU: the tail block goes first
    events = manager.drain_events()
    assert [type(e) for e in events] == [BlockStored, BlockStored, BlockRemoved]
    assert events[2].block_hash == events[1].block_hash
    assert manager.match_prefix(PrefixState(), [1, 2, 3, 4, 5]).blocks == (manager.by_hash[events[0].block_hash],)
    manager.check_invariants([other])


def test_a_forced_hash_collision_is_refused_by_the_token_comparison():
    manager = BlockManager(8, 2, enable_caching=True, hash_fn=lambda parent, extra, tokens: 42)
    table, _ = cached(manager, [1, 2, 3])
    assert manager.match_prefix(PrefixState(), [1, 2, 3]).blocks == (table[0],)
    assert manager.match_prefix(PrefixState(), [9, 9, 3]) == PrefixHit()  # same hash, other tokens
    # A second block hashing to the same value collides with the first: registration stops there.
    other, state = cached(manager, [9, 9, 9, 9, 9])
    assert state.broken and len(manager.entries) == 1
    manager.check_invariants([table, other])


def test_a_child_whose_parent_was_replaced_is_never_served():
    """Parent evicted, a colliding parent registered under its hash: the old child must not hit."""
    hashes = {(1, 2): 10, (3, 4): 11, (7, 8): 10}  # (7, 8) collides with (1, 2)
    manager = BlockManager(3, 2, enable_caching=True, hash_fn=lambda parent, extra, tokens: hashes[tuple(tokens)])
    table, _ = cached(manager, [1, 2, 3, 4, 0])
    manager.free(table)
    manager.by_hash.pop(10)  # evict the parent alone, as an LRU may
    parent_block = next(b for b, e in manager.entries.items() if e.block_hash == 10)
    del manager.entries[parent_block]
    del manager.evictable[parent_block]
    manager.free_blocks.append(parent_block)
    cached(manager, [7, 8, 0])
    assert manager.match_prefix(PrefixState(), [7, 8, 3, 4, 0]).blocks == (manager.by_hash[10],)


def test_different_extra_keys_never_share():
    manager = BlockManager(8, 2, enable_caching=True)
    cached(manager, [1, 2, 3], extra_keys("a"))
    assert manager.match_prefix(PrefixState(extra=extra_keys("b")), [1, 2, 3]) == PrefixHit()
    assert len(manager.match_prefix(PrefixState(extra=extra_keys("a")), [1, 2, 3]).blocks) == 1


def test_equal_blocks_computed_twice_are_cached_once_and_the_chain_goes_on():
    manager = BlockManager(8, 2, enable_caching=True)
    a_state, b_state, a, b = PrefixState(), PrefixState(), [], []
    manager.grow(a, 5)
    manager.grow(b, 5)
    tokens = [1, 2, 3, 4, 5]
    manager.cache_blocks(a_state, a, 4, lambda: tokens)
    manager.cache_blocks(b_state, b, 4, lambda: tokens)
    assert len(manager.entries) == 2 and b_state.serials == a_state.serials
    manager.free(a)
    manager.free(b)
    assert manager.num_cached_free_blocks == 2
    manager.check_invariants([])


def test_reset_forgets_cached_blocks_and_held_ones_register_again():
    manager = BlockManager(8, 2, enable_caching=True)
    table, state = cached(manager, [1, 2, 3, 4, 5])
    manager.reset()
    assert manager.entries == {} and isinstance(manager.drain_events()[-1], AllBlocksCleared)
    manager.cache_blocks(state, table, 5, lambda: [1, 2, 3, 4, 5])
    assert len(manager.entries) == 2
    manager.check_invariants([table])


def test_random_traffic_keeps_every_invariant():
    rng = random.Random(0)
    manager = BlockManager(24, 4, enable_caching=True)
    prefixes = [[rng.randrange(50) for _ in range(12)] for _ in range(3)]
    live: list[list[int]] = []
    for _ in range(400):
        if live and (rng.random() < 0.5 or manager.num_free_blocks < 6):
            manager.free(live.pop(rng.randrange(len(live))))
        else:
            tokens = rng.choice(prefixes)[: rng.randrange(1, 13)] + [rng.randrange(50) for _ in range(rng.randrange(6))]
            state, table = PrefixState(), []
            hit = manager.match_prefix(state, tokens)
            if not manager.can_take(hit, table, len(tokens)):
                continue
            manager.take(hit, state, table, len(tokens))
            manager.grow(table, len(tokens))
            manager.cache_blocks(state, table, len(tokens), lambda tokens=tokens: tokens)
            live.append(table)
        manager.check_invariants(live)
    assert manager.num_hit_tokens > 0
