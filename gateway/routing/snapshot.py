"""The routing view of one engine: plain data copied from the pool at the moment of a decision."""

from __future__ import annotations

from typing import NamedTuple


class EngineView(NamedTuple):
    """What the filters and policies may know about one connected (handshaken) engine.

    `num_in_flight` is counted by this gateway and always current; `num_running` and `num_waiting`
    come from the engine's last GetLoad answer and may be one health interval old.

    A named tuple, immutable like the snapshot it is: routing builds one per connected engine for
    every call, and a frozen dataclass's constructor (one `object.__setattr__` a field) cost 1.4 us
    where a tuple's costs 0.6 (issue 27).
    """

    address: str
    rank: int
    model: str
    is_healthy: bool
    is_draining: bool
    is_circuit_closed: bool
    num_in_flight: int = 0
    num_running: int = 0
    num_waiting: int = 0
    # Tokens of work the engine has: KV it holds for requests (GetLoad) plus prompt tokens this
    # gateway sent it that its cache did not hold, for calls still in flight.
    load_tokens: int = 0

    @property
    def load(self) -> int:
        """The larger of what this gateway sent and what the engine reports (DESIGN.md rule 5).

        Taking the max rather than the sum avoids counting our own calls twice, while still seeing
        load from other gateway replicas that share the engine.
        """
        return max(self.num_in_flight, self.num_running + self.num_waiting)
