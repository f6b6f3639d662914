"""Prefixes on their way into a cache: the block chains of calls routed but not finished.

The exact index knows a block only once an engine computed it, so calls with one prefix that
arrive while the first is still in prefill would each look like misses and scatter over the
engines (each then computing the prefix again). This keeps, per engine, the chains of the calls
this gateway has open there, and the prompts each engine announced as queued (so every replica
sees what the others routed: `AnnouncedPrefixes`); the policy counts them like cached blocks. An
entry lasts only while the call is open or the prompt unsettled: by then the engine's events have
put the blocks in the exact index. Pure data, no asyncio.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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


class AnnouncedPrefixes:
    """The prompts each engine announced as queued or in prefill (WatchKvEvents `announced`,
    gateway/kv_watch.py feeds it), counted into the in-flight prefixes until `settled`.

    The gateway's own open calls cover what this replica routed; the announcements cover every
    replica's, so N gateways in front of the same engines see each other's prefixes on their way
    into a cache a few milliseconds after the engine took them (the `add` and `remove` of one call
    from both sources are counted twice, harmlessly: a count only says "someone is computing it").
    Pure data, no asyncio.
    """

    __slots__ = ("_by_engine", "_in_flight")

    def __init__(self, in_flight: InFlightPrefixes) -> None:
        self._in_flight = in_flight
        self._by_engine: dict[str, dict[int, tuple[int, ...]]] = {}

    def replace(self, address: str, announced: Iterable[tuple[int, Sequence[int]]]) -> None:
        """A snapshot: exactly these (key, chain) are pending on `address` now."""
        self.drop(address)
        self._by_engine[address] = {}
        for key, chain in announced:
            self.announce(address, key, chain)

    def announce(self, address: str, key: int, chain: Sequence[int]) -> None:
        pending = self._by_engine.setdefault(address, {})
        earlier = pending.get(key)
        if earlier is not None:  # a key is announced once an incarnation; a repeat replaces it
            self._in_flight.remove(address, earlier)
        pending[key] = as_tuple = tuple(chain)
        self._in_flight.add(address, as_tuple)

    def settle(self, address: str, key: int) -> None:
        chain = self._by_engine.get(address, {}).pop(key, None)
        if chain is not None:
            self._in_flight.remove(address, chain)

    def drop(self, address: str) -> None:
        """Forget what `address` announced: its stream ended or it left."""
        for chain in self._by_engine.pop(address, {}).values():
            self._in_flight.remove(address, chain)

    def num_pending(self, address: str) -> int:
        return len(self._by_engine.get(address, ()))
