"""KvWatch applies a stream's messages to the index: a snapshot replaces, events edit in order, and
a message that does not follow (a gap, another incarnation) asks for a new subscription."""

from __future__ import annotations

from dpgate.v1 import control_pb2 as cpb
from gateway.kv_watch import KvWatch
from gateway.routing.kv_index import KvIndex


def snapshot(incarnation: str, number: int, hashes: list[int]) -> cpb.WatchKvEventsResponse:
    blocks = [cpb.KvBlock(block_hash=h, parent_hash=0, num_tokens=16) for h in hashes]
    return cpb.WatchKvEventsResponse(
        incarnation_id=incarnation, sequence_number=number, snapshot=cpb.KvSnapshot(blocks=blocks)
    )


def stored(incarnation: str, number: int, block_hash: int) -> cpb.WatchKvEventsResponse:
    message = cpb.WatchKvEventsResponse(incarnation_id=incarnation, sequence_number=number)
    message.stored.block.block_hash = block_hash
    return message


def test_snapshot_then_events_in_order_and_a_gap_or_new_incarnation_resubscribes():
    watch = KvWatch(KvIndex())
    assert watch._apply("e:1", snapshot("one", 5, [1, 2]))
    assert watch._apply("e:1", stored("one", 6, 3))
    removed = cpb.WatchKvEventsResponse(incarnation_id="one", sequence_number=7)
    removed.removed.block_hash = 1
    assert watch._apply("e:1", removed)
    assert watch.index.blocks_of("e:1") == {2, 3}
    assert not watch._apply("e:1", stored("one", 9, 4))  # 8 is missing
    assert not watch._apply("e:1", stored("two", 8, 4))  # another incarnation without a snapshot
    cleared = cpb.WatchKvEventsResponse(incarnation_id="one", sequence_number=8)
    cleared.cleared.SetInParent()
    assert watch._apply("e:1", cleared)
    assert watch.index.blocks_of("e:1") == set() and "e:1" in watch.index.addresses()
    assert watch._apply("e:1", snapshot("two", 0, [7]))  # a restart: the new incarnation's set
    assert watch.index.blocks_of("e:1") == {7} and watch.states["e:1"].incarnation_id == "two"


def test_announced_prompts_count_as_on_their_way_in_until_settled_or_the_stream_restarts():
    watch = KvWatch(KvIndex())
    pending = cpb.PendingPrefix(key=3, block_hashes=[1, 2])
    first = snapshot("one", 4, [1])
    first.snapshot.pending.append(pending)
    assert watch._apply("e:1", first)
    in_flight = watch.announced._in_flight  # the prefixes the policy reads beside the exact index
    assert in_flight.matched_blocks([1, 2, 5]) == {"e:1": 2}
    announced = cpb.WatchKvEventsResponse(incarnation_id="one", sequence_number=5)
    announced.announced.prefix.key = 4
    announced.announced.prefix.block_hashes.extend([1, 2, 5])
    assert watch._apply("e:1", announced)
    assert in_flight.matched_blocks([1, 2, 5]) == {"e:1": 3}
    settled = cpb.WatchKvEventsResponse(incarnation_id="one", sequence_number=6)
    settled.settled.key = 4
    assert watch._apply("e:1", settled)
    assert in_flight.matched_blocks([1, 2, 5]) == {"e:1": 2}
    assert watch._apply("e:1", snapshot("two", 0, []))  # a restart: nothing is pending any more
    assert in_flight.matched_blocks([1, 2]) == {} and watch.index.blocks_of("e:1") == set()
