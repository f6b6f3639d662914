from gateway.health_state import CircuitBreaker, CircuitState, HealthState, HealthStatus


def test_health_starts_unknown_and_needs_success_threshold():
    state = HealthState(failure_threshold=3, success_threshold=2)
    assert state.status is HealthStatus.UNKNOWN and not state.is_healthy
    assert state.record_success() is False
    assert state.record_success() is True
    assert state.is_healthy


def test_unknown_engine_fails_at_once_but_healthy_one_needs_threshold():
    state = HealthState(failure_threshold=3, success_threshold=1)
    assert state.record_failure() is True
    assert state.status is HealthStatus.UNHEALTHY
    state.record_success()
    assert state.is_healthy
    assert [state.record_failure() for _ in range(3)] == [False, False, True]
    assert not state.is_healthy


def test_a_success_resets_the_failure_count():
    state = HealthState(failure_threshold=2, success_threshold=1)
    state.record_success()
    state.record_failure()
    state.record_success()
    assert state.record_failure() is False
    assert state.is_healthy


def test_mark_unhealthy_skips_the_threshold():
    state = HealthState(failure_threshold=5, success_threshold=1)
    state.record_success()
    assert state.mark_unhealthy() is True
    assert state.mark_unhealthy() is False


def test_breaker_opens_after_threshold_and_half_opens_after_cool_down():
    breaker = CircuitBreaker(failure_threshold=2, open_seconds=10)
    assert breaker.allows_calls(0)
    assert breaker.record_failure(1) is False
    assert breaker.record_failure(2) is True
    assert breaker.state is CircuitState.OPEN
    assert not breaker.allows_calls(11.9)
    assert breaker.allows_calls(12)
    assert breaker.state is CircuitState.HALF_OPEN


def test_half_open_closes_on_success_and_reopens_on_failure():
    breaker = CircuitBreaker(failure_threshold=1, open_seconds=1)
    breaker.record_failure(0)
    breaker.allows_calls(5)
    assert breaker.record_failure(5) is True
    assert breaker.state is CircuitState.OPEN and breaker.opened_at == 5
    breaker.allows_calls(7)
    assert breaker.record_success() is True
    assert breaker.state is CircuitState.CLOSED


def test_success_in_between_keeps_the_breaker_closed():
    breaker = CircuitBreaker(failure_threshold=2, open_seconds=1)
    breaker.record_failure(0)
    breaker.record_success()
    assert breaker.record_failure(0) is False
    assert breaker.state is CircuitState.CLOSED


def test_reset_closes():
    breaker = CircuitBreaker(failure_threshold=1, open_seconds=100)
    breaker.record_failure(0)
    assert breaker.reset() is True
    assert breaker.allows_calls(0)
    assert breaker.reset() is False
