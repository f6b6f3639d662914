"""WatchKvEvents on the wire: the prefix-cache event log (kv_events.py) as a stream of messages.

One generator per subscriber: a snapshot first, then every event in order, woken by the log after
each publish; whenever the events it needs have left the log (it fell behind), a new snapshot.
Hashes travel as fixed64, never as doubles.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from dpgate.v1 import control_pb2
from engines.kv.block_manager import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    PrefixAnnounced,
    PrefixSettled,
)
from engines.serving.kv_events import KvEventLog, Snapshot


async def watch_kv_events(log: KvEventLog) -> AsyncIterator[control_pb2.WatchKvEventsResponse]:
    woken = asyncio.Event()
    loop = asyncio.get_running_loop()
    stop = log.listen(lambda: loop.call_soon_threadsafe(woken.set))
    try:
        last: int | None = None
        while True:
            events = log.since(last) if last is not None else None
            if events is None:
                snapshot = log.snapshot()
                last = snapshot.sequence_number
                yield kv_snapshot_message(log.incarnation_id, snapshot)
                continue
            for number, event in events:
                yield kv_event_message(log.incarnation_id, number, event)
                last = number
            if not events:
                woken.clear()
                if log.since(last) == []:  # nothing arrived between reading and clearing
                    await woken.wait()
    finally:
        stop()


def kv_snapshot_message(incarnation_id: str, snapshot: Snapshot) -> control_pb2.WatchKvEventsResponse:
    blocks = [control_pb2.KvBlock(block_hash=b, parent_hash=p, num_tokens=n) for b, p, n in snapshot.blocks]
    pending = [control_pb2.PendingPrefix(key=key, block_hashes=hashes) for key, hashes in snapshot.pending]
    return control_pb2.WatchKvEventsResponse(
        incarnation_id=incarnation_id,
        sequence_number=snapshot.sequence_number,
        snapshot=control_pb2.KvSnapshot(blocks=blocks, pending=pending),
        sent_unix_nanos=time.time_ns(),
    )


def kv_event_message(incarnation_id: str, number: int, event: KvEvent) -> control_pb2.WatchKvEventsResponse:
    message = control_pb2.WatchKvEventsResponse(
        incarnation_id=incarnation_id, sequence_number=number, sent_unix_nanos=time.time_ns()
    )
    if isinstance(event, BlockStored):
        block = message.stored.block
        block.block_hash, block.parent_hash, block.num_tokens = event.block_hash, event.parent_hash, event.num_tokens
    elif isinstance(event, BlockRemoved):
        message.removed.block_hash = event.block_hash
    elif isinstance(event, PrefixAnnounced):
        prefix = message.announced.prefix
        prefix.key = event.key
        prefix.block_hashes.extend(event.block_hashes)
    elif isinstance(event, PrefixSettled):
        message.settled.key = event.key
    else:
        assert isinstance(event, AllBlocksCleared)
        message.cleared.SetInParent()
    return message
