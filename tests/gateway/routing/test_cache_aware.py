"""The cache-aware policy on hand-made snapshots: hits, ties, a hot prefix, an empty index, a stale engine."""

from __future__ import annotations

from collections import Counter

from gateway.routing import EngineView, RouteRequest, choose_engine_for_request
from gateway.routing.cache_aware import CacheAware, CacheAwareWeights, RouteReason
from gateway.routing.filters import PromptBlocks


def view(rank: int, *, calls: int = 0, tokens: int = 0, healthy: bool = True) -> EngineView:
    return EngineView(
        address=f"e{rank}:1", rank=rank, model="m", is_healthy=healthy, is_draining=False,
        is_circuit_closed=True, num_in_flight=calls, load_tokens=tokens,
    )  # fmt: skip


def ask(prompt_tokens: int, **matched: int) -> RouteRequest:
    return RouteRequest(prompt=PromptBlocks(prompt_tokens, {f"{k}:1": v for k, v in matched.items()}))


def test_the_engine_holding_the_prefix_wins_and_says_cache():
    policy = CacheAware()
    engines = [view(0), view(1, tokens=100), view(2)]
    assert policy.select(engines, ask(1000, e1=960)) == 1
    assert policy.last_reason is RouteReason.CACHE and policy.last_matched_tokens == 960


def test_load_in_tokens_outweighs_a_small_hit():
    policy = CacheAware()
    engines = [view(0, tokens=5000), view(1, tokens=0)]
    assert policy.select(engines, ask(1000, e0=32)) == 1
    assert policy.last_reason is RouteReason.LOAD


def test_by_default_a_held_prefix_outweighs_a_load_gap_smaller_than_16_prompts_of_it():
    """The default prefill weight (16, chosen by bench/routing.py): a group's 1,000-token prefix
    stays on its engine though that engine holds 8,000 more load tokens (at weight 1 it moved, and
    every engine it moved to computed the prefix again); a gap past 16 x the saving moves it."""
    policy = CacheAware()
    assert policy.select([view(0, tokens=8000), view(1)], ask(1064, e0=992)) == 0
    assert policy.last_reason is RouteReason.CACHE
    assert policy.select([view(0, tokens=17_000), view(1)], ask(1064, e0=992)) == 1


def test_misses_rotate_over_tied_engines_never_the_same_one():
    policy = CacheAware()
    engines = [view(0), view(1), view(2)]
    picks = [policy.select(engines, ask(500)) for _ in range(6)]
    assert sorted(Counter(picks).values()) == [2, 2, 2]
    assert picks[0] != picks[1] != picks[2]


def test_ties_go_to_the_fewest_calls_before_rotating():
    policy = CacheAware()
    engines = [view(0, calls=3), view(1, calls=1), view(2, calls=3)]
    assert {policy.select(engines, ask(500)) for _ in range(4)} == {1}


def test_a_hot_prefix_spills_once_its_engine_passes_the_balance_bound():
    policy = CacheAware(CacheAwareWeights(balance_ratio=1.5, balance_slack=2))
    # Within ratio x least + slack = 1.5 x 2 + 2 = 5 calls the holder keeps the hot prefix...
    engines = [view(0, calls=5), view(1, calls=2), view(2, calls=3)]
    assert policy.select(engines, ask(1000, e0=992)) == 0
    # ...past it the call goes to the cheapest engine within the bound, and says why.
    engines = [view(0, calls=6), view(1, calls=2), view(2, calls=3, tokens=10)]
    assert policy.select(engines, ask(1000, e0=992)) == 1
    assert policy.last_reason is RouteReason.BALANCE and policy.last_matched_tokens == 0


def test_hot_prefix_spreads_over_a_simulated_stream():
    """Every call shares one prefix held by engine 0; calls finish slower than they come."""
    policy = CacheAware()
    calls = [0, 0, 0, 0]
    for _ in range(40):
        engines = [view(r, calls=calls[r]) for r in range(4)]
        calls[policy.select(engines, ask(1000, e0=992))] += 1
    assert max(calls) <= 1.5 * min(calls) + 4 + 1


def test_empty_index_and_no_prompt_are_least_loaded():
    policy = CacheAware()
    engines = [view(0, calls=2), view(1, calls=0, tokens=900), view(2, calls=1)]
    assert policy.select(engines, ask(100)) in (0, 2)  # load in tokens decides with a prompt
    assert policy.select(engines, RouteRequest()) == 1  # without one: calls, as least-loaded
    assert policy.select(engines) == 1
    assert policy.last_reason is RouteReason.LOAD


def test_a_stale_engine_in_the_index_is_filtered_before_the_policy():
    """The index still names an unhealthy engine (its stream has not ended yet): it cannot win."""
    engines = [view(0, healthy=False), view(1), view(2)]
    chosen = choose_engine_for_request(engines, ask(1000, e0=992, e2=16), CacheAware())
    assert chosen.rank == 2


def test_an_engine_the_index_names_but_not_connected_is_ignored():
    policy = CacheAware()
    engines = [view(0), view(1)]
    assert policy.select(engines, ask(1000, e7=992, e1=16)) == 1
