"""Fixtures for the gateway's end-to-end tests: two real tiny-model engines shared by the session, and a
synthetic engine per module with a starter of gateways in front of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gateway_processes import (
    FAST_HEALTH,
    EngineProcess,
    GatewayProcess,
    all_serving,
    gateway_starter,
    running_synthetic_engine,
)


@pytest.fixture(scope="session")
def engines(tiny_model_dir: Path, log_dir: Path):
    """Ranks 0 and 1 of a DP-2 deployment, real `dpgate engine` processes on the tiny model."""
    with all_serving([EngineProcess(tiny_model_dir, rank, 2, log_dir) for rank in (0, 1)]) as pair:
        yield pair


@pytest.fixture(scope="session")
def gateway(engines: list[EngineProcess], log_dir: Path):
    process = GatewayProcess([e.address for e in engines], *FAST_HEALTH, log_dir=log_dir)
    try:
        process.wait_ranks([0, 1])
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def synthetic_engine(log_dir: Path):
    """A synthetic engine (no model, milliseconds a token) for the module's gateways."""
    with running_synthetic_engine(log_dir) as process:
        yield process


@pytest.fixture
def start_gateway(synthetic_engine, log_dir: Path, request: pytest.FixtureRequest):
    """`start_gateway(*flags)`: a gateway with those flags in front of the module's synthetic engine,
    returned once it serves rank 0 and stopped after the test (named after the module in the logs)."""
    name = "gateway-" + request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").removesuffix("_e2e")
    with gateway_starter(synthetic_engine, log_dir) as start:

        def start_serving(*flags: str) -> GatewayProcess:
            gateway = start(*flags, name=name)
            gateway.wait_ranks([0])
            return gateway

        yield start_serving

