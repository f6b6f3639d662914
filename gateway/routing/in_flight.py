"""Prefixes on their way into a cache: the block chains of calls routed but not finished.

The exact index knows a block only once an engine computed it, so calls with one prefix that
arrive while the first is still in prefill would each look like misses and scatter over the
engines (each then computing the prefix again). This keeps, per engine, the chains of the calls
this gateway has open there; the policy counts them like cached blocks. It is this gateway's own
knowledge (replicas do not share it), and it lasts only while the call is open: by then the
engine's events have put the blocks in the exact index. Pure data, no asyncio.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


class InFlightPrefixes:
    """block hash -> Counter(address -> calls open there whose prompt has that block)."""

    __slots__ = ("_holders",)

    def __init__(self) -> None:
        self._holders: dict[int, Counter[str]] = {}

    def add(self, address: str, chain: Sequence[int]) -> None:
        for block_hash in chain:
            self._holders.setdefault(block_hash, Counter())[address] += 1

    def remove(self, address: str, chain: Sequence[int]) -> None:
        for block_hash in chain:
            holders = self._holders.get(block_hash)
            if holders is None or holders[address] <= 0:
                continue  # our invariant says never; a miscount must not raise on the data path
            holders[address] -= 1
            if holders[address] == 0:
                del holders[address]
                if not holders:
                    del self._holders[block_hash]

    def __len__(self) -> int:
        return len(self._holders)

    def matched_blocks(self, chain: Sequence[int]) -> dict[str, int]:
        """For each engine with open calls sharing the chain's first block: leading blocks shared."""
        matched: dict[str, int] = {}
        alive: set[str] | None = None
        for depth, block_hash in enumerate(chain):
            holders = self._holders.get(block_hash)
            if not holders:
                break
            alive = set(holders) if alive is None else alive & holders.keys()
            if not alive:
                break
            for address in alive:
                matched[address] = depth + 1
        return matched
