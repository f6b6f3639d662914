"""The piece ids cache: least recently used out first, within its entries and its bytes."""

from __future__ import annotations

import sys
from array import array

import pytest

from gateway.piece_ids_cache import PieceIdsCache


def test_the_least_recently_used_piece_goes_first_when_entries_run_out():
    cache = PieceIdsCache(max_entries=2, max_bytes=1 << 20)
    cache.put("f", "a", array("I", [1]))
    cache.put("f", "b", array("I", [2]))
    assert cache.get("f", "a") == array("I", [1])  # "a" is now the most recent
    cache.put("f", "c", array("I", [3]))
    assert cache.get("f", "b") is None and cache.get("f", "a") is not None and len(cache) == 2
    assert cache.get("g", "a") is None  # another tokenizer's ids are its own


def test_bytes_are_counted_and_bounded_and_a_replaced_piece_is_not_counted_twice():
    piece = "x" * 100
    size = sys.getsizeof(piece) + 4 * 10
    cache = PieceIdsCache(max_entries=100, max_bytes=2 * size + 10)
    cache.put("f", piece, array("I", range(10)))
    cache.put("f", piece, array("I", range(10)))
    assert cache.num_bytes == size and len(cache) == 1
    cache.put("f", "y" * 100, array("I", range(10)))
    cache.put("f", "z" * 100, array("I", range(10)))
    assert len(cache) == 2 and cache.num_bytes == 2 * size and cache.get("f", piece) is None
    cache.put("f", "w" * 10_000, array("I", range(10)))  # larger than the whole cache: not kept
    assert cache.get("f", "w" * 10_000) is None and cache.num_bytes == 2 * size


def test_bounds_below_one_are_refused_naming_them():
    with pytest.raises(ValueError, match="max_entries"):
        PieceIdsCache(max_entries=0)
