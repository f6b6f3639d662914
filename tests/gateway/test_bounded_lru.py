"""The bounded LRU behind the piece and chain caches: least recently used out first, within its
entries and its bytes."""

from __future__ import annotations

import pytest

from gateway.bounded_lru import BoundedLru


def test_the_least_recently_used_entry_goes_first_when_entries_run_out():
    cache = BoundedLru(max_entries=2, max_bytes=1 << 20)
    cache.put(("f", "a"), 1, 10)
    cache.put(("f", "b"), 2, 10)
    assert cache.get(("f", "a")) == 1  # "a" is now the most recent
    cache.put(("f", "c"), 3, 10)
    assert cache.get(("f", "b")) is None and cache.get(("f", "a")) == 1 and len(cache) == 2
    assert cache.get(("g", "a")) is None
    assert cache.get_many([("f", "c"), ("f", "b"), ("f", "a")]) == [3, None, 1]  # "a" most recent again
    cache.put(("f", "d"), 4, 10)
    assert cache.get(("f", "c")) is None and cache.get(("f", "a")) == 1


def test_bytes_are_counted_and_bounded_and_a_replaced_entry_is_not_counted_twice():
    cache = BoundedLru(max_entries=100, max_bytes=250)
    cache.put("a", 1, 100)
    cache.put("a", 1, 100)
    assert cache.num_bytes == 100 and len(cache) == 1
    cache.put("b", 2, 100)
    cache.put("c", 3, 100)
    assert len(cache) == 2 and cache.num_bytes == 200 and cache.get("a") is None
    cache.put("w", 4, 251)  # larger than the whole cache: not kept
    assert cache.get("w") is None and cache.num_bytes == 200


def test_bounds_below_one_are_refused_naming_them():
    with pytest.raises(ValueError, match="max_entries"):
        BoundedLru(max_entries=0)
