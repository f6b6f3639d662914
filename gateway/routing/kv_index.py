"""The exact prefix-cache index: block hash -> the engines whose cache holds that block.

Built from the engines' own WatchKvEvents streams (gateway/kv_watch.py feeds it), so it never
guesses: a snapshot replaces what was known of an engine, each stored/removed/cleared event edits
it, and an engine whose stream ends leaves it until a new snapshot arrives. Pure data, no grpc or
asyncio: the routing policy reads it through `matched_blocks`, tests drive it directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.routing.leading_blocks import leading_blocks


class KvIndex:
    """Which engine (by address) holds which cached block (by its 64-bit hash).

    Invariant: `_holders[h]` contains address `a` exactly when `h in _blocks[a]`; no empty sets
    are kept in `_holders`.
    """

    __slots__ = ("_blocks", "_holders")

    def __init__(self) -> None:
        self._holders: dict[int, set[str]] = {}
        self._blocks: dict[str, set[int]] = {}

    def replace(self, address: str, block_hashes: Iterable[int]) -> None:
        """A snapshot: `address` holds exactly `block_hashes` now (a (re)connect or a resync)."""
        self.drop(address)
        blocks = self._blocks[address] = set()
        for block_hash in block_hashes:
            blocks.add(block_hash)
            self._holders.setdefault(block_hash, set()).add(address)

    def add(self, address: str, block_hash: int) -> None:
        self._blocks.setdefault(address, set()).add(block_hash)
        self._holders.setdefault(block_hash, set()).add(address)

    def remove(self, address: str, block_hash: int) -> None:
        blocks = self._blocks.get(address)
        if blocks is None or block_hash not in blocks:
            return
        blocks.discard(block_hash)
        holders = self._holders[block_hash]
        holders.discard(address)
        if not holders:
            del self._holders[block_hash]

    def clear(self, address: str) -> None:
        """The engine forgot its whole cache (ResetPrefixCache); it stays known, holding nothing."""
        self.drop(address)
        self._blocks[address] = set()

    def drop(self, address: str) -> None:
        """Forget the engine: it left, restarted, or its stream ended (nothing it held is known)."""
        for block_hash in self._blocks.pop(address, ()):
            holders = self._holders[block_hash]
            holders.discard(address)
            if not holders:
                del self._holders[block_hash]

    def holders(self, block_hash: int) -> frozenset[str]:
        return frozenset(self._holders.get(block_hash, ()))

    def blocks_of(self, address: str) -> frozenset[int]:
        return frozenset(self._blocks.get(address, ()))

    def num_blocks(self, address: str) -> int:
        return len(self._blocks.get(address, ()))

    def addresses(self) -> list[str]:
        """Engines the index knows (a live stream has given a snapshot), in no order."""
        return list(self._blocks)

    def matched_blocks(self, chain: Sequence[int]) -> dict[str, int]:
        """For each engine holding the chain's first block: how many leading blocks it holds.

        The engine takes only a prefix of consecutive cached blocks, so a block held past a gap
        is worth nothing; the walk stops for an engine at its first missing block.
        """
        return leading_blocks(chain, self._holders)
