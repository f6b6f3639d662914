"""A least-recently-used cache bounded by entry count and by bytes. Pure bookkeeping; not
thread-safe (its owner holds a lock)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    num_bytes: int


class BoundedCache(Generic[K, V]):
    def __init__(self, max_entries: int, max_bytes: int):
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("a cache needs room for at least one entry and one byte")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._entries: OrderedDict[K, _Entry[V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: K, value: V, num_bytes: int) -> None:
        """Keep `value`, evicting the least recently used entries until both bounds hold. A value
        larger than the whole byte bound is not kept."""
        if key in self._entries:
            self.num_bytes -= self._entries.pop(key).num_bytes
        if num_bytes > self.max_bytes:
            return
        self._entries[key] = _Entry(value, num_bytes)
        self.num_bytes += num_bytes
        while len(self._entries) > self.max_entries or self.num_bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.num_bytes -= evicted.num_bytes
