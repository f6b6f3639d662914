"""EngineDiscovery: the union of every name's answer goes to the pool; a failed lookup keeps the last one."""

from __future__ import annotations

import asyncio

from gateway.discovery import EngineDiscovery, engine_address
from gateway.dns_resolver import DnsLookupError


class ScriptedResolver:
    """Answers each name with the next scripted result (a tuple of addresses or an exception)."""

    def __init__(self, script: dict[str, list[tuple[str, ...] | Exception]]) -> None:
        self._script = script

    async def resolve(self, name: str) -> tuple[str, ...]:
        result = self._script[name].pop(0)
        if isinstance(result, Exception):
            raise result
        return result


class RecordingPool:
    def __init__(self) -> None:
        self.rounds: list[set[str]] = []

    def set_discovered(self, addresses) -> None:
        self.rounds.append(set(addresses))


def rounds(targets, script, num_rounds: int) -> list[set[str]]:
    pool = RecordingPool()
    discovery = EngineDiscovery(targets, ScriptedResolver(script), 1.0, pool)  # type: ignore[arg-type]

    async def run() -> None:
        for _ in range(num_rounds):
            await discovery.refresh()

    asyncio.run(run())
    return pool.rounds


def test_ipv6_addresses_are_bracketed():
    assert engine_address("10.0.0.7", 50061) == "10.0.0.7:50061"
    assert engine_address("fd00::7", 50061) == "[fd00::7]:50061"


def test_the_pool_gets_the_union_of_every_name_with_its_own_port():
    script = {"a": [("10.0.0.1", "fd00::1")], "b": [("10.0.0.1",)]}
    assert rounds((("a", 1), ("b", 2)), script, 1) == [{"10.0.0.1:1", "[fd00::1]:1", "10.0.0.1:2"}]


def test_a_failed_lookup_keeps_the_last_answer_but_an_empty_answer_retires_all():
    script = {"a": [("10.0.0.1", "10.0.0.2"), DnsLookupError("a: timeout"), ("10.0.0.2",), ()]}
    assert rounds((("a", 1),), script, 4) == [
        {"10.0.0.1:1", "10.0.0.2:1"},
        {"10.0.0.1:1", "10.0.0.2:1"},
        {"10.0.0.2:1"},
        set(),
    ]


def test_a_name_that_never_answered_contributes_nothing():
    script = {"a": [DnsLookupError("a: timeout")], "b": [("10.0.0.3",)]}
    assert rounds((("a", 1), ("b", 1)), script, 1) == [{"10.0.0.3:1"}]
