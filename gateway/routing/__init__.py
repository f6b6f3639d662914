"""Choosing the engine for one call: a chain of small filters, then one policy pick.

Pure code: it sees plain snapshots of the engines (`EngineView`) and returns a decision or raises a
`gateway.errors` exception, so every rule is tested without a socket.
"""

from gateway.routing.choose import RouteRequest, choose_engine_for_request
from gateway.routing.policies import POLICIES, RoutingPolicy, make_policy
from gateway.routing.snapshot import EngineView

__all__ = [
    "POLICIES",
    "EngineView",
    "RouteRequest",
    "RoutingPolicy",
    "choose_engine_for_request",
    "make_policy",
]
