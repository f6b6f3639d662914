"""The perplexity gate's arithmetic: windows, perplexity and the relative bound."""

from __future__ import annotations

import math

import pytest

from dpgate.e2e.gates.perplexity import TEXT_PATH
from dpgate.e2e.gates.perplexity_math import Comparison, make_windows, perplexity


def test_windows_are_non_overlapping_and_drop_the_short_tail():
    ids = list(range(10, 33))  # 23 tokens
    windows = make_windows(ids, 5, bos_token_id=None)
    assert [w.prompt for w in windows] == [tuple(range(10 + 5 * i, 15 + 5 * i)) for i in range(4)]
    assert [w.num_scored for w in windows] == [4] * 4  # a window's first token is only context


def test_with_a_bos_token_every_window_starts_with_it_and_all_its_text_tokens_are_scored():
    windows = make_windows(list(range(100, 112)), 4, bos_token_id=2, max_windows=2)
    assert [w.prompt for w in windows] == [(2, 100, 101, 102, 103), (2, 104, 105, 106, 107)]
    assert sum(w.num_scored for w in windows) == 8


def test_a_window_shorter_than_two_tokens_is_refused():
    with pytest.raises(ValueError, match="window length must be >= 2"):
        make_windows([1, 2, 3], 1, None)


def test_perplexity_is_exp_of_the_mean_negative_logprob():
    assert perplexity(-4 * math.log(8.0), 4) == pytest.approx(8.0, rel=1e-12)
    assert perplexity(0.0, 3) == 1.0
    with pytest.raises(ValueError, match="at least one scored token"):
        perplexity(0.0, 0)


def test_the_bound_is_relative_and_inclusive_on_both_sides():
    # binary fractions, so "exactly on the bound" is exact: 10 / 8 = 1.25 and 6 / 8 = 0.75
    assert Comparison(10.0, 8.0, 0.25).passed and Comparison(6.0, 8.0, 0.25).passed
    assert not Comparison(10.01, 8.0, 0.25).passed and not Comparison(5.99, 8.0, 0.25).passed
    assert Comparison(12.0, 10.0, 0.005).ratio == pytest.approx(1.2)
    assert Comparison(12.0, 10.0, 0.005).relative_difference == pytest.approx(0.2)


def test_the_bundled_text_is_packaged_with_its_notice():
    text = TEXT_PATH.read_text(encoding="utf-8")
    assert len(text) > 80_000
    notice = (TEXT_PATH.parent / "NOTICE").read_text()
    assert "Python Software Foundation License Version 2" in notice and "CPython 3.11.7" in notice
    assert (TEXT_PATH.parent / "PSF-LICENSE-2.txt").read_text().startswith("PYTHON SOFTWARE FOUNDATION LICENSE")
