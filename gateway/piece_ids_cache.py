"""The token ids of text pieces already encoded (gateway/token_chunks.py says where text may be cut).

Prompts that gain from cache-aware routing share long prefixes (a system prompt, a conversation's
history), and encoding is most of the cost of reading one: 1.3 ms for 1,000 tokens against tens of
microseconds to look its pieces up here. A piece's ids depend on its text alone, so the key is
(tokenizer fingerprint, piece text); ids are kept as `array('I')` (4 bytes each), which the block
hash reads as bytes. Least recently used first out, bounded in entries and in bytes (the piece's
str object plus its ids). Called from the event loop and from worker threads: one lock.
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections import OrderedDict

# Bounds for one gateway: a piece is ~256 chars, ~60 ids (~0.6 KB); 64 MiB holds ~100k pieces,
# some 25M characters of distinct prompt text.
MAX_ENTRIES = 131_072
MAX_BYTES = 64 * 1024 * 1024


class PieceIdsCache:
    """(fingerprint, piece) -> the piece's ids, LRU, within `max_entries` and `max_bytes`."""

    __slots__ = ("_entries", "_lock", "max_bytes", "max_entries", "num_bytes")

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"max_entries ({max_entries}) and max_bytes ({max_bytes}) must be at least 1")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.num_bytes = 0
        self._entries: OrderedDict[tuple[str, str], tuple[array, int]] = OrderedDict()  # key -> (ids, bytes)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, fingerprint: str, piece: str) -> array | None:
        key = (fingerprint, piece)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, fingerprint: str, piece: str, ids: array) -> None:
        size = sys.getsizeof(piece) + ids.itemsize * len(ids)
        if size > self.max_bytes:
            return  # one piece larger than the whole cache (a text without cuts): not kept
        key = (fingerprint, piece)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.num_bytes -= old[1]
            self._entries[key] = (ids, size)
            self.num_bytes += size
            while len(self._entries) > self.max_entries or self.num_bytes > self.max_bytes:
                _, (_, evicted_size) = self._entries.popitem(last=False)
                self.num_bytes -= evicted_size
