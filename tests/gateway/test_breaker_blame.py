"""The breaker's one table (`health_state.BREAKER_BLAME`): complete, what it blames, how the pool
applies it, and that docs/gateway.md shows the same table."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import grpc
import pytest

from gateway.config import GatewayConfig, validate_config
from gateway.engine_pool import EnginePool
from gateway.handshake import EngineIdentity
from gateway.health_state import BREAKER_BLAME, PROBE_AT_ONCE, Blame, CallEvent, CircuitState, blame_for
from gateway.metrics import GatewayMetrics

DOCS = Path(__file__).resolve().parents[2] / "docs" / "gateway.md"
# What the issue names as the client's doing: never counts against an engine.
CLIENT_CAUSED = (
    "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNAUTHENTICATED", "FAILED_PRECONDITION",
    "OUT_OF_RANGE", "CANCELLED", "DEADLINE_EXCEEDED", CallEvent.CLIENT_CANCELLED, CallEvent.CLIENT_DEADLINE,
)  # fmt: skip


def test_every_status_code_and_call_event_has_a_row():
    assert set(BREAKER_BLAME) == {code.name for code in grpc.StatusCode} | set(CallEvent)


@pytest.mark.parametrize("outcome", CLIENT_CAUSED, ids=str)
def test_what_a_client_causes_is_never_the_engines_fault(outcome):
    assert blame_for(outcome) is Blame.CLIENT


def test_only_the_engines_own_failures_count():
    blamed = {outcome for outcome, blame in BREAKER_BLAME.items() if blame is Blame.ENGINE}
    assert blamed == {
        "INTERNAL", "UNAVAILABLE", "DATA_LOSS", CallEvent.CONNECT_FAILED, CallEvent.CONNECT_TIMEOUT,
        CallEvent.CONNECTION_LOST, CallEvent.STREAM_REFUSED, CallEvent.STREAM_RESET, CallEvent.STREAM_CANCELLED,
        CallEvent.NO_STATUS,
    }  # fmt: skip
    assert blame_for("UNKNOWN") is Blame.UNPROVEN  # what gRPC says when it cannot classify
    assert blame_for("NOT_A_CODE") is Blame.UNPROVEN
    assert blamed >= PROBE_AT_ONCE


def run_with_pool(check) -> None:
    async def main() -> None:
        config = validate_config(GatewayConfig(engines=("127.0.0.1:1",), breaker_failure_threshold=2))
        pool = EnginePool(config, GatewayMetrics())
        engine = pool.engines[0]
        engine.accept(EngineIdentity(engine.address, 0, 1, "m"))
        try:
            check(pool, engine)
        finally:
            await pool.close()

    asyncio.run(main())


def test_outcomes_that_blame_nobody_neither_count_nor_clear_the_streak():
    """A hostile client's errors between two engine failures must not hide them, nor close a
    half-open circuit that a real call has yet to prove."""

    def check(pool, engine):
        assert pool.record_outcome(engine, "INTERNAL") is Blame.ENGINE
        for outcome in (*CLIENT_CAUSED, "UNKNOWN", CallEvent.GATEWAY_ENDED):
            pool.record_outcome(engine, outcome)
        assert engine.breaker.state is CircuitState.CLOSED
        pool.record_outcome(engine, CallEvent.CONNECTION_LOST)
        assert engine.breaker.state is CircuitState.OPEN
        engine.breaker.open_seconds = 0
        assert engine.breaker.allows_calls(time.monotonic())
        assert engine.breaker.state is CircuitState.HALF_OPEN
        pool.record_outcome(engine, "INVALID_ARGUMENT")
        assert engine.breaker.state is CircuitState.HALF_OPEN
        assert pool.record_outcome(engine, "OK") is Blame.NONE
        assert engine.breaker.state is CircuitState.CLOSED

    run_with_pool(check)


@pytest.mark.parametrize("outcome", sorted(PROBE_AT_ONCE, key=str), ids=str)
def test_signs_of_a_gone_engine_wake_its_watcher(outcome):
    def check(pool, engine):
        pool.record_outcome(engine, outcome)
        assert engine.wake.is_set()

    run_with_pool(check)


def test_client_outcomes_do_not_wake_the_watcher():
    def check(pool, engine):
        for outcome in CLIENT_CAUSED:
            pool.record_outcome(engine, outcome)
        assert not engine.wake.is_set()

    run_with_pool(check)


def docs_table() -> dict[str, str]:
    """docs/gateway.md's breaker table: outcome -> whose doing ('engine', 'client', ...)."""
    text = DOCS.read_text()
    section = text.split("<!-- breaker-blame-table -->", 2)[1]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            for outcome in re.findall(r"`([^`]+)`", cells[0]):
                rows[outcome] = cells[1]
    return rows


def test_docs_show_the_same_table():
    expected = {
        (outcome.value if isinstance(outcome, CallEvent) else outcome): blame.value
        for outcome, blame in BREAKER_BLAME.items()
    }
    assert docs_table() == expected
