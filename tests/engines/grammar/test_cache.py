"""The compiled-grammar cache is bounded by entries and by bytes, least recently used first out."""

from __future__ import annotations

import pytest

from engines.grammar.cache import BoundedCache


def test_the_least_recently_used_entry_leaves_first():
    cache = BoundedCache(max_entries=2, max_bytes=100)
    cache.put("a", 1, 1)
    cache.put("b", 2, 1)
    assert cache.get("a") == 1  # "b" is now the oldest
    cache.put("c", 3, 1)
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3


def test_the_byte_bound_evicts_until_it_holds_and_refuses_what_could_never_fit():
    cache = BoundedCache(max_entries=10, max_bytes=100)
    cache.put("a", 1, 60)
    cache.put("b", 2, 30)
    cache.put("c", 3, 50)
    assert "a" not in cache and len(cache) == 2 and cache.num_bytes == 80
    cache.put("huge", 4, 101)
    assert "huge" not in cache and cache.num_bytes == 80


def test_replacing_an_entry_recounts_its_bytes():
    cache = BoundedCache(max_entries=10, max_bytes=100)
    cache.put("a", 1, 60)
    cache.put("a", 2, 10)
    assert cache.get("a") == 2 and cache.num_bytes == 10


def test_a_cache_without_room_is_a_configuration_error():
    with pytest.raises(ValueError):
        BoundedCache(max_entries=0, max_bytes=1)
