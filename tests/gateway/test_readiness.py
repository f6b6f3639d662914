"""When the gateway's health says SERVING (gateway.readiness): standalone vs `dpgate serve`."""

import pytest

from gateway.readiness import is_ready


def test_nothing_routable_is_never_ready():
    assert not is_ready(set(), None, None, has_been_ready=False)
    assert not is_ready(set(), 2, 2, has_been_ready=True)


def test_standalone_gateway_is_ready_with_any_routable_engine():
    assert is_ready({1}, 4, None, has_been_ready=False)


@pytest.mark.parametrize(
    ("routable", "reported_size"),
    [({0}, 2), ({1}, 2), ({0, 1}, 3), ({0, 1}, None)],
)
def test_serve_is_not_ready_until_every_rank_is_routable(routable, reported_size):
    assert not is_ready(routable, reported_size, 2, has_been_ready=False)


def test_serve_is_ready_once_every_rank_is_routable():
    assert is_ready({0, 1}, 2, 2, has_been_ready=False)
    assert is_ready({0}, 1, 1, has_been_ready=False)


def test_after_the_first_time_serve_follows_the_standalone_rule():
    """Losing one engine later keeps the front door in rotation: pins to it get UNAVAILABLE."""
    assert is_ready({0}, 2, 2, has_been_ready=True)
