"""The engine's prefix-cache events, numbered, for WatchKvEvents subscribers (several at once).

The engine thread publishes the block manager's events after each step; the log numbers them
(one count per engine incarnation, from 1), keeps the last `capacity` of them and a mirror of the
cached set they describe. A subscriber starts from a snapshot of that mirror (taken under the same
lock as the numbering, so snapshot and events never disagree) and then reads events after the
number it has; when the ones it needs have already left the log, it gets a new snapshot instead:
never a silent gap. Thread-safe: publish on the engine thread, read on the event loop.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engines.kv.block_manager import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    PrefixAnnounced,
    PrefixSettled,
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every cached block as (hash, parent hash, tokens), in the order cached, and every prompt
    announced and not settled as (key, block hashes), after event `sequence_number`."""

    sequence_number: int
    blocks: list[tuple[int, int, int]]
    pending: list[tuple[int, tuple[int, ...]]]


class KvEventLog:
    def __init__(self, capacity: int = 65536, incarnation_id: str | None = None):
        self.incarnation_id = incarnation_id or uuid.uuid4().hex
        self.capacity = capacity
        self._lock = threading.Lock()
        self._blocks: dict[int, tuple[int, int]] = {}  # hash -> (parent hash, tokens)
        self._pending: dict[int, tuple[int, ...]] = {}  # announced prompt key -> its block hashes
        self._events: deque[tuple[int, KvEvent]] = deque(maxlen=capacity)
        self._last = 0
        self._listeners: list[Callable[[], None]] = []

    def publish(self, events: list[KvEvent]) -> None:
        if not events:
            return
        with self._lock:
            for event in events:
                self._last += 1
                self._events.append((self._last, event))
                if isinstance(event, BlockStored):
                    self._blocks[event.block_hash] = (event.parent_hash, event.num_tokens)
                elif isinstance(event, BlockRemoved):
                    self._blocks.pop(event.block_hash, None)
                elif isinstance(event, PrefixAnnounced):
                    self._pending[event.key] = event.block_hashes
                elif isinstance(event, PrefixSettled):
                    self._pending.pop(event.key, None)
                elif isinstance(event, AllBlocksCleared):
                    self._blocks.clear()  # queued prompts stay announced: they will still fill blocks
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def snapshot(self) -> Snapshot:
        with self._lock:
            blocks = [(block, parent, tokens) for block, (parent, tokens) in self._blocks.items()]
            return Snapshot(self._last, blocks, list(self._pending.items()))

    def since(self, sequence_number: int) -> list[tuple[int, KvEvent]] | None:
        """The events after `sequence_number`, in order; None when some already left the log."""
        with self._lock:
            if sequence_number >= self._last:
                return []
            first = self._events[0][0] if self._events else self._last + 1
            if first > sequence_number + 1:
                return None
            return [item for item in self._events if item[0] > sequence_number]

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` (on the publishing thread) after each publish; returns the way to stop."""
        with self._lock:
            self._listeners.append(listener)

        def stop() -> None:
            with self._lock:
                self._listeners.remove(listener)

        return stop
