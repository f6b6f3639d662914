"""Assembles the gateway: the grpc.aio server, its services, the engine pool, metrics, and drain.

`GatewayServer.start()` binds and returns the port; `drain()` runs the SIGTERM sequence:
health NOT_SERVING first (load balancers stop sending), then the drain grace (calls still
accepted while they notice), then new calls are refused with UNAVAILABLE while in-flight calls
finish, up to the shutdown timeout counted from the start of the drain, and whatever is still
running is then cancelled (which cancels its upstream call).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from dpgate.v1 import control_pb2, generate_pb2
from gateway.config import ConfigError, GatewayConfig
from gateway.engine_client import CONTROL_SERVICE, INFERENCE_SERVICE, UNARY_METHODS
from gateway.engine_pool import EnginePool
from gateway.forwarding import Forwarder
from gateway.interceptors import Admission, build_interceptors
from gateway.metrics import GatewayMetrics
from gateway.routing import make_policy

logger = logging.getLogger("dpgate.gateway")

SERVICES = (INFERENCE_SERVICE, CONTROL_SERVICE)
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def server_options(config: GatewayConfig) -> list[tuple[str, int]]:
    """Message limits and keepalive toward clients.

    Long generations can send nothing for minutes, so client keepalive pings must be welcome
    during quiet calls: pings are accepted down to `min_client_ping_interval_s` apart (gRPC's
    default is 5 minutes, which ends a call with GOAWAY `too_many_pings` when a client pings every
    10 s), and the gateway pings idle clients itself to find dead ones.
    """
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.keepalive_time_ms", int(config.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.min_client_ping_interval_s * 1000)),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.so_reuseport", 0),
    ]


def ensure_bindable(host: str, port: int, flag: str) -> None:
    """Fail with one sentence naming `flag` when (host, port) cannot be bound.

    Checked before gRPC binds, because gRPC's own failure also prints a C-core error line.
    """
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise ConfigError(f"--host {host!r} does not resolve to an address.") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise ConfigError(f"{flag} {port}: cannot bind {host}:{port} ({error.strerror}).") from None


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def server_credentials(config: GatewayConfig) -> grpc.ServerCredentials | None:
    """TLS credentials, requiring client certificates when a client CA is configured (mutual TLS)."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    client_ca = _read(config.tls_client_ca_file) if config.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(_read(config.tls_key_file), _read(config.tls_cert_file))],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


class GatewayServer:
    """One gateway process's serving side; create, `start()`, then `drain()` or `stop()`."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.pool = EnginePool(config, self.metrics)
        self.forwarder = Forwarder(self.pool, make_policy(config.policy), self.metrics)
        self.admission = Admission(lambda: self.forwarder.num_in_flight, config.max_in_flight)
        self.health = health_aio.HealthServicer()
        self.server = aio.server(
            interceptors=build_interceptors(config.api_keys, self.admission, self.metrics),
            options=server_options(config),
        )
        self.port = 0
        self.metrics_port: int | None = None
        self._is_draining = False
        self._health_task: asyncio.Task | None = None

    def _add_services(self) -> None:
        unary = {
            method: grpc.unary_unary_rpc_method_handler(self.forwarder.unary_behavior(method))
            for _, method in UNARY_METHODS
        }
        unary["Abort"] = grpc.unary_unary_rpc_method_handler(self.forwarder.abort)
        inference = {
            "Generate": unary.pop("Generate"),
            "GenerateStream": grpc.unary_stream_rpc_method_handler(self.forwarder.generate_stream),
        }
        for service, handlers in ((INFERENCE_SERVICE, inference), (CONTROL_SERVICE, unary)):
            self.server.add_registered_method_handlers(service, handlers)
            self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        # The descriptors come from the generated modules (imported above), so reflection works.
        assert generate_pb2.DESCRIPTOR and control_pb2.DESCRIPTOR
        health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        reflection.enable_server_reflection((*SERVICES, health_name, reflection.SERVICE_NAME), self.server)

    async def start(self) -> int:
        """Bind, start serving and watching engines; return the bound port."""
        self._add_services()
        for service in ("", *SERVICES):
            await self.health.set(service, _NOT_SERVING)
        self.pool.add_listener(self._on_engines_changed)
        address = f"{self.config.host}:{self.config.port}"
        credentials = server_credentials(self.config)
        ensure_bindable(self.config.host, self.config.port, "--port")
        try:
            if credentials is None:
                self.port = self.server.add_insecure_port(address)
            else:
                self.port = self.server.add_secure_port(address, credentials)
        except RuntimeError:  # grpc's way of saying the bind failed
            raise ConfigError(f"--port {self.config.port}: cannot bind {address} (in use or not permitted).") from None
        if self.config.metrics_port is not None:
            try:
                self.metrics_port = self.metrics.serve(self.config.host, self.config.metrics_port)
            except OSError as error:
                raise ConfigError(
                    f"--metrics-port {self.config.metrics_port}: cannot bind ({error.strerror})."
                ) from None
        await self.server.start()
        await self.pool.start()
        return self.port

    def _on_engines_changed(self) -> None:
        status = _SERVING if self.pool.has_routable_engine else _NOT_SERVING
        if self._health_task is not None and not self._health_task.done():
            self._health_task.cancel()
        self._health_task = asyncio.get_running_loop().create_task(self._set_health(status))

    async def _set_health(self, status: int) -> None:
        for service in ("", *SERVICES):
            await self.health.set(service, status)

    async def drain(self) -> None:
        """The SIGTERM sequence (see the module docstring); returns when the server has stopped."""
        if self._is_draining:
            return
        self._is_draining = True
        started = time.monotonic()
        logger.info("draining: health NOT_SERVING, grace %.1fs", self.config.drain_grace_s)
        await self.health.enter_graceful_shutdown()
        await asyncio.sleep(self.config.drain_grace_s)
        self.admission.is_refusing = True
        deadline = started + self.config.shutdown_timeout_s
        logger.info("refusing new calls; waiting for %d in flight", self.forwarder.num_in_flight)
        while self.forwarder.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.forwarder.num_in_flight:
            logger.warning("shutdown timeout: cancelling %d calls in flight", self.forwarder.num_in_flight)
        await self.stop()

    async def stop(self) -> None:
        """Stop at once: in-flight calls are cancelled, and with them their upstream calls."""
        await self.server.stop(grace=None)
        await self.pool.close()
