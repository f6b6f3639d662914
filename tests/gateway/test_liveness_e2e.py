"""Health "liveness" says the gateway process works, whatever its engines do (Kubernetes liveness probe)."""

from __future__ import annotations

import signal
import time

from grpc_health.v1 import health_pb2

from gateway.server import LIVENESS_SERVICE
from tests.support.gateway_processes import FAST_HEALTH, GatewayProcess, free_port
from tests.support.health import health_status

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def test_a_gateway_without_engines_is_alive_but_not_ready_and_draining_ends_both(log_dir):
    nothing_there = f"127.0.0.1:{free_port()}"
    gateway = GatewayProcess(
        [nothing_there], *FAST_HEALTH, "--drain-grace", "2", "--shutdown-timeout", "5",
        log_dir=log_dir, name="gateway-liveness",
    )  # fmt: skip
    try:
        assert health_status(gateway.address, LIVENESS_SERVICE) == SERVING
        assert health_status(gateway.address) == NOT_SERVING
        gateway.process.send_signal(signal.SIGTERM)
        # The drain grace keeps the front door answering: by then liveness has turned NOT_SERVING too.
        deadline = time.monotonic() + 1.5
        while health_status(gateway.address, LIVENESS_SERVICE) != NOT_SERVING:
            assert time.monotonic() < deadline, "liveness still SERVING while the gateway drains"
            time.sleep(0.02)
        assert gateway.process.wait(10) == 0
    finally:
        gateway.stop()
