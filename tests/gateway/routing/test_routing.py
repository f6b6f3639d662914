import random

import pytest

from gateway.errors import InvalidArgument, NotFound, Unavailable
from gateway.routing import EngineView, RouteRequest, choose_engine_for_request, make_policy
from gateway.routing.policies import LeastLoaded, PowerOfTwo, RoundRobin


def view(rank, **overrides):
    fields = dict(
        address=f"h:{rank + 1}",
        rank=rank,
        model="m",
        is_healthy=True,
        is_draining=False,
        is_circuit_closed=True,
    )
    fields.update(overrides)
    return EngineView(**fields)


def choose(engines, policy=None, data_parallel_size=None, **request):
    return choose_engine_for_request(
        engines, RouteRequest(**request), policy or LeastLoaded(), data_parallel_size=data_parallel_size
    )


def test_pinned_rank_is_served_by_its_owner_whatever_the_load():
    engines = [view(0), view(1, num_in_flight=50), view(2)]
    assert all(choose(engines, rank=1).rank == 1 for _ in range(10))


def test_ranks_are_global_not_positions():
    engines = [view(5), view(3)]
    assert choose(engines, rank=3).address == "h:4"


def test_unknown_rank_is_invalid_argument_listing_connected_ranks():
    with pytest.raises(InvalidArgument) as info:
        choose([view(2), view(0)], rank=7)
    assert info.value.message == (
        "data parallel rank 7 is not connected to this gateway; connected ranks: [0, 2]"
    )


def test_a_pin_before_any_handshake_is_unavailable():
    with pytest.raises(Unavailable, match="data parallel rank 0 cannot be served yet: no engine has passed"):
        choose([], rank=0)


@pytest.mark.parametrize("rank", [1, 2])
def test_rank_below_the_handshaken_dp_size_without_its_engine_is_unavailable(rank):
    """Ranks 1 and 2 of a DP-3 deployment are not connected yet (or any more): the client may retry."""
    with pytest.raises(Unavailable) as info:
        choose([view(0)], rank=rank, data_parallel_size=3)
    assert info.value.message == (
        f"data parallel rank {rank} of data parallel size 3 is not connected to this gateway right now; "
        "connected ranks: [0]"
    )


@pytest.mark.parametrize("rank", [2, 3, 2**32 - 1])
def test_rank_at_or_beyond_the_handshaken_dp_size_is_invalid_argument(rank):
    with pytest.raises(InvalidArgument) as info:
        choose([view(0), view(1)], rank=rank, data_parallel_size=2)
    assert info.value.message == (
        f"data parallel rank {rank} is not connected to this gateway; connected ranks: [0, 1]"
    )


@pytest.mark.parametrize("rank", [0, 7])
def test_unknown_dp_size_makes_every_pin_retryable(rank):
    """Before any handshake the gateway cannot tell a missing rank from a wrong one, and serves
    nothing: the state is transient, so the code is too."""
    with pytest.raises(Unavailable, match="no engine has passed the handshake"):
        choose([], rank=rank, data_parallel_size=None)


def test_owned_pins_and_unpinned_calls_ignore_the_dp_size():
    engines, policy = [view(0), view(2)], LeastLoaded()
    assert choose(engines, rank=2, data_parallel_size=3).rank == 2
    assert {choose(engines, policy, data_parallel_size=3).rank for _ in range(4)} == {0, 2}
    with pytest.raises(Unavailable, match="no engine is connected"):
        choose([], data_parallel_size=3)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"is_healthy": False}, "is not healthy"),
        ({"is_draining": True}, "is draining"),
        ({"is_circuit_closed": False}, "has an open circuit breaker"),
    ],
)
def test_known_but_unusable_pinned_rank_is_unavailable_never_another_rank(overrides, reason):
    with pytest.raises(Unavailable) as info:
        choose([view(0), view(1, **overrides)], rank=1)
    assert info.value.message == f"data parallel rank 1 {reason}"


def test_pinned_rank_of_another_model_is_not_found():
    with pytest.raises(NotFound):
        choose([view(0, model="other")], rank=0, model="m")


def test_unpinned_skips_filtered_engines():
    engines = [view(0, is_healthy=False), view(1, is_draining=True), view(2, is_circuit_closed=False), view(3)]
    assert {choose(engines).rank for _ in range(5)} == {3}


def test_unpinned_with_nothing_usable_is_unavailable():
    with pytest.raises(Unavailable, match="not healthy"):
        choose([view(0, is_healthy=False)])
    with pytest.raises(Unavailable, match="no engine is connected"):
        choose([])


def test_unpinned_refusal_names_the_filter_that_left_no_candidate():
    """Engines fail different filters: the call's refusal is the filter that emptied the chain
    (run in order), not the first that removed some engine."""
    engines = [view(0, is_healthy=False), view(1, is_draining=True), view(2, is_circuit_closed=False)]
    with pytest.raises(Unavailable, match="every candidate has an open circuit breaker"):
        choose(engines)
    with pytest.raises(Unavailable, match="every candidate is draining"):
        choose(engines[:2])
    with pytest.raises(NotFound, match="model 'other'"):  # the model filter runs before draining
        choose([view(0, is_draining=True), view(1, model="x")], model="other")


def test_unpinned_unknown_model_is_not_found():
    with pytest.raises(NotFound):
        choose([view(0)], model="nope")


def test_excluded_addresses_are_skipped_for_retries():
    engines = [view(0), view(1)]
    assert choose(engines, excluded_addresses=frozenset({"h:1"})).rank == 1


def test_least_loaded_uses_max_of_in_flight_and_engine_queue():
    assert view(0, num_in_flight=2, num_running=1, num_waiting=4).load == 5
    assert view(0, num_in_flight=7, num_running=1, num_waiting=4).load == 7
    engines = [view(0, num_running=1, num_waiting=4), view(1, num_in_flight=3)]
    assert choose(engines).rank == 1


def test_least_loaded_ties_rotate_deterministically():
    engines = [view(1), view(0), view(2, num_in_flight=1)]
    first_policy, second_policy = LeastLoaded(), LeastLoaded()
    first = [choose(engines, first_policy).rank for _ in range(4)]
    again = [choose(engines, second_policy).rank for _ in range(4)]
    assert first == again == [1, 0, 1, 0]


def test_round_robin_cycles_in_rank_order():
    policy = RoundRobin()
    engines = [view(2), view(0), view(1)]
    assert [engines[policy.select(engines)].rank for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_power_of_two_picks_the_less_loaded_of_its_pair():
    engines = [view(0, num_in_flight=9), view(1, num_in_flight=1), view(2, num_in_flight=5)]
    policy = PowerOfTwo(random.Random(0))
    picks = [engines[policy.select(engines)].rank for _ in range(200)]
    assert 0 not in picks  # rank 0 is the most loaded of any pair it is in
    assert set(picks) == {1, 2}
    assert PowerOfTwo().select([view(0)]) == 0


def test_make_policy_gives_fresh_instances():
    assert isinstance(make_policy("round-robin"), RoundRobin)
    assert make_policy("least-loaded") is not make_policy("least-loaded")
