"""The KV event log against the block manager it mirrors: after random traffic with evictions and
resets, a subscriber that applies snapshot + events holds exactly the manager's cached set, also
one that falls behind (the log forgot what it needed) and gets a fresh snapshot instead of a gap."""

from __future__ import annotations

import random

from engines.kv.block_manager import (
    AllBlocksCleared,
    BlockManager,
    BlockRemoved,
    BlockStored,
    PrefixAnnounced,
    PrefixSettled,
    PrefixState,
)
from engines.serving.kv_events import KvEventLog


class Subscriber:
    def __init__(self, log: KvEventLog):
        self.log = log
        self.blocks: dict[int, tuple[int, int]] = {}
        self.last: int | None = None
        self.snapshots = 0

    def poll(self) -> None:
        events = self.log.since(self.last) if self.last is not None else None
        if events is None:
            snapshot = self.log.snapshot()
            self.blocks = {block: (parent, n) for block, parent, n in snapshot.blocks}
            self.last, self.snapshots = snapshot.sequence_number, self.snapshots + 1
            return
        for number, event in events:
            assert number == self.last + 1, "a gap without a snapshot"
            self.last = number
            if isinstance(event, BlockStored):
                self.blocks[event.block_hash] = (event.parent_hash, event.num_tokens)
            elif isinstance(event, BlockRemoved):
                del self.blocks[event.block_hash]
            else:
                assert isinstance(event, AllBlocksCleared)
                self.blocks.clear()


def expected(manager: BlockManager) -> dict[int, tuple[int, int]]:
    return {e.block_hash: (e.parent_hash, len(e.token_ids)) for e in manager.entries.values()}


def test_subscribers_reproduce_the_cached_set_through_evictions_resets_and_falling_behind():
    rng = random.Random(1)
    manager = BlockManager(40, 4, enable_caching=True, root=99)
    log = KvEventLog(capacity=50)
    steady, slow = Subscriber(log), Subscriber(log)
    prefixes = [[rng.randrange(30) for _ in range(24)] for _ in range(5)]
    live: list[list[int]] = []
    num_removed = 0
    for step in range(1000):
        if live and (rng.random() < 0.5 or manager.num_free_blocks < 8):
            manager.free(live.pop(rng.randrange(len(live))))
        else:
            tokens = rng.choice(prefixes)[: rng.randrange(1, 25)] + [rng.randrange(30) for _ in range(rng.randrange(9))]
            state, table = PrefixState(extra=bytes([rng.randrange(2)])), []
            hit = manager.match_prefix(state, tokens)
            if manager.can_take(hit, table, len(tokens)):
                manager.take(hit, state, table, len(tokens))
                manager.grow(table, len(tokens))
                manager.cache_blocks(state, table, len(tokens), lambda tokens=tokens: tokens)
                live.append(table)
        if step % 300 == 299:
            manager.reset()
        events = manager.drain_events()
        num_removed += sum(isinstance(event, BlockRemoved) for event in events)
        log.publish(events)
        steady.poll()
        if step % 97 == 0:  # rarely: the log has moved past it, so it must re-snapshot
            slow.poll()
        assert steady.blocks == expected(manager)
    slow.poll()
    assert slow.blocks == steady.blocks == expected(manager)
    assert steady.snapshots == 1 and slow.snapshots > 1
    assert num_removed > 50  # evictions happened throughout


def test_a_snapshot_carries_the_prompts_announced_and_not_yet_settled():
    log = KvEventLog()
    log.publish([PrefixAnnounced(1, (10, 11)), PrefixAnnounced(2, (10,)), BlockStored(10, 99, 4)])
    log.publish([PrefixSettled(2), AllBlocksCleared()])  # a reset forgets blocks, not queued prompts
    snapshot = log.snapshot()
    assert snapshot.sequence_number == 5 and snapshot.blocks == [] and snapshot.pending == [(1, (10, 11))]
