"""The prefixes of open calls: counted per engine, leading blocks only, gone when the calls end."""

from __future__ import annotations

from gateway.routing.in_flight import InFlightPrefixes


def test_open_calls_count_until_each_one_closes():
    opened = InFlightPrefixes()
    opened.add("a", (1, 2, 3))
    opened.add("a", (1, 2))
    opened.add("b", (1, 9))
    assert opened.matched_blocks([1, 2, 3, 4]) == {"a": 3, "b": 1}
    opened.remove("a", (1, 2, 3))
    assert opened.matched_blocks([1, 2, 3]) == {"a": 2, "b": 1}
    opened.remove("a", (1, 2))
    opened.remove("b", (1, 9))
    assert opened.matched_blocks([1, 2, 3]) == {} and len(opened) == 0
    opened.remove("b", (1, 9))  # a second close is harmless
    assert len(opened) == 0
