"""Prefixes on their way into a cache: the block chains of calls routed but not finished.

The exact index knows a block only once an engine computed it, so calls with one prefix that
arrive while the first is still in prefill would each look like misses and scatter over the
engines (each then computing the prefix again). This keeps, per engine, the chains of the calls
this gateway has open there; the policy counts them like cached blocks. It is this gateway's own
knowledge (replicas do not share it), and it lasts only while the call is open: by then the
engine's events have put the blocks in the exact index. Pure data, no asyncio.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.leading_blocks import leading_blocks


class InFlightPrefixes:
    """block hash -> {address -> calls open there whose prompt has that block} (plain dicts: this
    runs for every block of every routed call, twice)."""

    __slots__ = ("_holders",)

    def __init__(self) -> None:
        self._holders: dict[int, dict[str, int]] = {}

    def add(self, address: str, chain: Sequence[int]) -> None:
        every = self._holders
        for block_hash in chain:
            holders = every.get(block_hash)
            if holders is None:
                every[block_hash] = {address: 1}
            else:
                holders[address] = holders.get(address, 0) + 1

    def remove(self, address: str, chain: Sequence[int]) -> None:
        every = self._holders
        for block_hash in chain:
            holders = every.get(block_hash)
            count = 0 if holders is None else holders.get(address, 0)
            if count <= 0:
                continue  # our invariant says never; a miscount must not raise on the data path
            if count > 1:
                holders[address] = count - 1
            else:
                del holders[address]
                if not holders:
                    del every[block_hash]

    def __len__(self) -> int:
        return len(self._holders)

    def matched_blocks(self, chain: Sequence[int]) -> dict[str, int]:
        """For each engine with open calls sharing the chain's first block: leading blocks shared."""
        return leading_blocks(chain, self._holders)
