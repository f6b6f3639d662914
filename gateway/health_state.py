"""Per-engine health state machine and circuit breaker: plain state, explicit clock, no I/O.

Two signals decide whether an engine gets calls, and they are kept apart on purpose:
- `HealthState` follows the active probes (grpc.health.v1 Check every health interval): an engine
  becomes unhealthy after `failure_threshold` failed probes in a row and healthy again after
  `success_threshold` good ones. It starts UNKNOWN, which routing treats as not healthy.
- `CircuitBreaker` follows the outcome of forwarded calls: `failure_threshold` engine failures in a
  row open it; after `open_seconds` it lets calls through again (HALF_OPEN) and the first outcome
  closes or reopens it. Callers decide which outcomes count (RESOURCE_EXHAUSTED does not).
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
