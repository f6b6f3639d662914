"""The prefixes of open calls and of prompts the engines announced: counted per engine, leading
blocks only, gone when the calls end or the engine settles them."""

from __future__ import annotations

from gateway.routing.in_flight import AnnouncedPrefixes, InFlightPrefixes


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


def test_engine_announcements_count_beside_open_calls_until_settled_or_dropped():
    opened = InFlightPrefixes()
    announced = AnnouncedPrefixes(opened)
    opened.add("a", (1, 2))  # this gateway's own call
    announced.announce("a", 7, (1, 2, 3))  # another replica's call, as the engine announced it
    announced.announce("b", 8, (1, 2))
    assert opened.matched_blocks([1, 2, 3]) == {"a": 3, "b": 2}
    announced.settle("a", 7)
    assert opened.matched_blocks([1, 2, 3]) == {"a": 2, "b": 2}
    announced.settle("a", 7)  # settled twice (or never announced): nothing more leaves
    opened.remove("a", (1, 2))
    assert opened.matched_blocks([1, 2, 3]) == {"b": 2}
    announced.replace("b", [(9, (5, 6))])  # a snapshot: what b announced before is void
    assert opened.matched_blocks([1, 2]) == {} and opened.matched_blocks([5, 6]) == {"b": 2}
    assert announced.num_pending("b") == 1
    announced.drop("b")  # b's stream ended
    assert len(opened) == 0 and announced.num_pending("b") == 0
