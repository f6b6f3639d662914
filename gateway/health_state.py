"""Per-engine health state machine and circuit breaker: plain state, explicit clock, no I/O.

Two signals decide whether an engine gets calls, and they are kept apart on purpose:
- `HealthState` follows the active probes (grpc.health.v1 Check every health interval): an engine
  becomes unhealthy after `failure_threshold` failed probes in a row and healthy again after
  `success_threshold` good ones. It starts UNKNOWN, which routing treats as not healthy.
- `CircuitBreaker` follows the outcome of forwarded calls: `failure_threshold` engine failures in a
  row open it; after `open_seconds` it lets calls through again (HALF_OPEN) and the first outcome
  closes or reopens it. Which outcomes are engine failures is `BREAKER_BLAME`, the one table
  (docs/gateway.md repeats it): only the engine's own failures count. What a client caused never
  does, and neither does an outcome that does not show the engine failed: one careless or
  hostile client must not be able to open the circuit for everyone else.
Time is passed in (`now`, seconds on a monotonic clock) so tests drive it without sleeping.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class HealthStatus(enum.Enum):
    UNKNOWN = "unknown"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


@dataclass(slots=True)
class HealthState:
    """Consecutive-probe thresholds; `record_*` return True when the status changed."""

    failure_threshold: int
    success_threshold: int
    status: HealthStatus = HealthStatus.UNKNOWN
    num_consecutive_failures: int = 0
    num_consecutive_successes: int = 0

    @property
    def is_healthy(self) -> bool:
        return self.status is HealthStatus.HEALTHY

    def record_success(self) -> bool:
        self.num_consecutive_failures = 0
        self.num_consecutive_successes += 1
        is_enough = self.num_consecutive_successes >= self.success_threshold
        if self.status is not HealthStatus.HEALTHY and is_enough:
            self.status = HealthStatus.HEALTHY
            return True
        return False

    def record_failure(self) -> bool:
        self.num_consecutive_successes = 0
        self.num_consecutive_failures += 1
        if self.status is not HealthStatus.UNHEALTHY and (
            self.status is HealthStatus.UNKNOWN or self.num_consecutive_failures >= self.failure_threshold
        ):
            # An engine never seen healthy needs no grace: it is simply not up yet.
            self.status = HealthStatus.UNHEALTHY
            return True
        return False

    def mark_unhealthy(self) -> bool:
        """Skip the threshold: the engine is known to be gone (its connection broke)."""
        self.num_consecutive_successes = 0
        if self.status is HealthStatus.UNHEALTHY:
            return False
        self.status = HealthStatus.UNHEALTHY
        return True


class Blame(enum.Enum):
    """Whose doing a forwarded call's outcome was, as far as the circuit breaker is concerned."""

    NONE = "none"  # the engine served the call: a success
    ENGINE = "engine"  # the engine's own failure: counts against its breaker
    CLIENT = "client"  # the client caused it (its input, its deadline, its cancel): never counts
    UNPROVEN = "unproven"  # nothing shows the engine failed: never counts


class CallEvent(enum.Enum):
    """The ways a forwarded call ends without the engine answering with a gRPC status."""

    CONNECT_FAILED = "connect failed"  # no connection to the engine could be opened
    CONNECT_TIMEOUT = "connect timeout"  # the engine accepted no connection within the health timeout
    CONNECTION_LOST = "connection lost"  # the engine's connection closed with the call open
    STREAM_REFUSED = "stream refused"  # RST_STREAM REFUSED_STREAM, or GOAWAY before the stream
    STREAM_RESET = "stream reset"  # RST_STREAM with an error (PROTOCOL_ERROR, INTERNAL_ERROR, ...)
    STREAM_CANCELLED = "stream cancelled"  # RST_STREAM CANCEL sent by the engine
    ENHANCE_YOUR_CALM = "enhance your calm"  # RST_STREAM ENHANCE_YOUR_CALM: the engine sheds load
    NO_STATUS = "no status"  # the response ended without a grpc-status
    RESPONSE_TOO_LARGE = "response too large"  # a response message over --max-message-bytes
    CLIENT_CANCELLED = "client cancelled"  # the client reset the stream or went away
    CLIENT_DEADLINE = "client deadline"  # the client's deadline passed at the gateway
    GATEWAY_ENDED = "gateway ended"  # the gateway ended the call itself (shutdown timeout)


# The one table: a forwarded call's outcome -> whose doing it was. An outcome is the name of the
# gRPC status code the engine answered with, or a CallEvent. Every code and event has a row
# (tests/gateway/test_breaker_blame.py checks it); docs/gateway.md shows the same table.
BREAKER_BLAME: dict[str | CallEvent, Blame] = {
    "OK": Blame.NONE,
    # The client's input, identity or request: nothing about the engine's health.
    "INVALID_ARGUMENT": Blame.CLIENT,
    "NOT_FOUND": Blame.CLIENT,
    "ALREADY_EXISTS": Blame.CLIENT,
    "PERMISSION_DENIED": Blame.CLIENT,
    "UNAUTHENTICATED": Blame.CLIENT,
    "FAILED_PRECONDITION": Blame.CLIENT,
    "OUT_OF_RANGE": Blame.CLIENT,
    "UNIMPLEMENTED": Blame.CLIENT,  # a method or feature the client asked for and the engine lacks
    "RESOURCE_EXHAUSTED": Blame.CLIENT,  # too large for the engine, or its queue is full: back-pressure
    "CANCELLED": Blame.CLIENT,  # the call was cancelled (by its client, or the gateway for it)
    "DEADLINE_EXCEEDED": Blame.CLIENT,  # the client's deadline, which the gateway passes on
    # Codes that by themselves do not say the engine broke.
    "UNKNOWN": Blame.UNPROVEN,  # what gRPC answers for anything it cannot classify
    "ABORTED": Blame.UNPROVEN,  # a conflict the client may retry
    # The engine says it failed or cannot serve.
    "INTERNAL": Blame.ENGINE,
    "UNAVAILABLE": Blame.ENGINE,
    "DATA_LOSS": Blame.ENGINE,
    # Transport events: evidence that the engine (or the way to it) failed.
    CallEvent.CONNECT_FAILED: Blame.ENGINE,
    CallEvent.CONNECT_TIMEOUT: Blame.ENGINE,
    CallEvent.CONNECTION_LOST: Blame.ENGINE,
    CallEvent.STREAM_REFUSED: Blame.ENGINE,
    CallEvent.STREAM_RESET: Blame.ENGINE,
    CallEvent.STREAM_CANCELLED: Blame.ENGINE,
    CallEvent.NO_STATUS: Blame.ENGINE,  # a response without a status breaks the gRPC protocol
    CallEvent.ENHANCE_YOUR_CALM: Blame.UNPROVEN,  # load shedding, like RESOURCE_EXHAUSTED
    CallEvent.RESPONSE_TOO_LARGE: Blame.CLIENT,  # the client asked for that much
    # Endings on the gateway's side.
    CallEvent.CLIENT_CANCELLED: Blame.CLIENT,
    CallEvent.CLIENT_DEADLINE: Blame.CLIENT,
    CallEvent.GATEWAY_ENDED: Blame.UNPROVEN,
}

# Outcomes that suggest the engine is gone: its health watcher probes at once instead of waiting
# for the next interval (this decides health probing only, not the breaker).
PROBE_AT_ONCE: frozenset[str | CallEvent] = frozenset(
    {
        "UNAVAILABLE",
        CallEvent.CONNECT_FAILED,
        CallEvent.CONNECT_TIMEOUT,
        CallEvent.CONNECTION_LOST,
        CallEvent.STREAM_REFUSED,
    }
)


def blame_for(outcome: str | CallEvent) -> Blame:
    """The table's answer; a code it does not know (none today) is not blamed on the engine."""
    return BREAKER_BLAME.get(outcome, Blame.UNPROVEN)


class CircuitState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True)
class CircuitBreaker:
    """Stops sending calls to an engine whose calls keep failing, then probes it with real calls."""

    failure_threshold: int
    open_seconds: float
    state: CircuitState = CircuitState.CLOSED
    num_consecutive_failures: int = 0
    opened_at: float = 0.0

    def allows_calls(self, now: float) -> bool:
        """Whether routing may pick this engine; an expired OPEN turns HALF_OPEN here."""
        if self.state is CircuitState.OPEN and now - self.opened_at >= self.open_seconds:
            self.state = CircuitState.HALF_OPEN
        return self.state is not CircuitState.OPEN

    def record_success(self) -> bool:
        """A call the engine answered; returns True when the state changed."""
        self.num_consecutive_failures = 0
        if self.state is CircuitState.CLOSED:
            return False
        self.state = CircuitState.CLOSED
        return True

    def record_failure(self, now: float) -> bool:
        """A call the engine failed; returns True when the state changed."""
        self.num_consecutive_failures += 1
        if self.state is CircuitState.HALF_OPEN or (
            self.state is CircuitState.CLOSED and self.num_consecutive_failures >= self.failure_threshold
        ):
            self.state = CircuitState.OPEN
            self.opened_at = now
            return True
        return False

    def reset(self) -> bool:
        """Close the circuit: used when the engine re-handshakes after a restart (a new process)."""
        self.num_consecutive_failures = 0
        if self.state is CircuitState.CLOSED:
            return False
        self.state = CircuitState.CLOSED
        return True
