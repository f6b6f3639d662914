"""A least-recently-used map bounded in entries and in bytes, safe across threads.

The gateway keeps two such caches for the cache-aware path (gateway/prompt_tokenizers.py): the
token ids of text pieces it has encoded, and the block hashes those pieces complete (gateway/
routing/chain_cache.py). Prompts that gain from cache-aware routing share long prefixes (a system
prompt, a conversation's history), so both are found again and again. The caller states each
entry's size in bytes (what it holds beyond what the key already costs); used from the event loop
and from worker threads, under one lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

# Bounds for one cache of one gateway: a piece is ~256 chars and ~60 ids (~0.6 KB), so 64 MiB
# holds ~100k pieces, some 25M characters of distinct prompt text.
MAX_ENTRIES = 131_072
MAX_BYTES = 64 * 1024 * 1024


class BoundedLru:
    """key -> value, least recently used out first, within `max_entries` and `max_bytes`."""

    __slots__ = ("_entries", "_lock", "max_bytes", "max_entries", "num_bytes")

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"max_entries ({max_entries}) and max_bytes ({max_bytes}) must be at least 1")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.num_bytes = 0
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()  # key -> (value, bytes)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def get_many(self, keys: list[Hashable]) -> list[Any | None]:
        """`[get(key) for key in keys]` under one taking of the lock."""
        entries = self._entries
        found: list[Any | None] = []
        with self._lock:
            for key in keys:
                entry = entries.get(key)
                if entry is None:
                    found.append(None)
                else:
                    entries.move_to_end(key)
                    found.append(entry[0])
        return found

    def put(self, key: Hashable, value: Any, size: int) -> None:
        if size > self.max_bytes:
            return  # one entry larger than the whole cache (a text without cuts): not kept
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.num_bytes -= old[1]
            self._entries[key] = (value, size)
            self.num_bytes += size
            while len(self._entries) > self.max_entries or self.num_bytes > self.max_bytes:
                _, (_, evicted_size) = self._entries.popitem(last=False)
                self.num_bytes -= evicted_size
