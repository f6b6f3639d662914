"""Fixtures for the gateway's end-to-end tests: two real tiny-model engines, shared by the session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gateway_processes import FAST_HEALTH, EngineProcess, GatewayProcess, all_serving


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
