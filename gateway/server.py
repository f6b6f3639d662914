"""Assembles the gateway: the front door, its local services, the engine pool, metrics, and drain.

The front door (gateway/front_door.py) speaks HTTP/2 itself and relays dpgate.v1 calls to the
engines; health and reflection are served by a small grpc.aio server on a loopback port that the
front door relays to, so they keep gRPC's own implementations.

Health ("" and each service) is NOT_SERVING until `gateway.readiness.is_ready` says otherwise:
any routable engine for `dpgate gateway`, every rank for `dpgate serve` (its config sets
`ready_data_parallel_size`).
Health "liveness" is SERVING from start to drain whatever the engines do: a liveness probe
(Kubernetes `grpc:` probe with `service: liveness`) must restart a stuck gateway, never one that
is merely waiting for engines.

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
import ssl
import time

from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from dpgate.servicer_guard import ServicerGuard
from dpgate.v1 import control_pb2, generate_pb2
from gateway.config import ConfigError, GatewayConfig
from gateway.discovery import EngineDiscovery
from gateway.dns_resolver import make_resolver
from gateway.engine_client import CONTROL_SERVICE, INFERENCE_SERVICE
from gateway.engine_pool import EnginePool
from gateway.forwarding import Forwarder
from gateway.front_door import ClientConnection, listen
from gateway.metrics import GatewayMetrics
from gateway.openai.server import OpenAIServer
from gateway.readiness import is_ready
from gateway.routing import make_policy
from gateway.routing.cache_aware import CacheAwareWeights
from gateway.status_table import INTERNAL_ERROR_MESSAGE
from gateway.upstream import UpstreamLink

logger = logging.getLogger("dpgate.gateway")

SERVICES = (INFERENCE_SERVICE, CONTROL_SERVICE)
LIVENESS_SERVICE = "liveness"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


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


class GatewayServer:
    """One gateway process's serving side; create, `start()`, then `drain()` or `stop()`."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.pool = EnginePool(config, self.metrics)
        policy = make_policy(config.policy, cache_aware_weights(config))
        self.forwarder = Forwarder(self.pool, policy, self.metrics, config)
        self.health = health_aio.HealthServicer()
        # Health and reflection live on a grpc.aio server the front door relays to (loopback only);
        # the guard answers bodies that are not valid messages with INVALID_ARGUMENT.
        self.local_services = aio.server(interceptors=(ServicerGuard(INTERNAL_ERROR_MESSAGE),))
        self.connections: set[ClientConnection] = set()
        self.front_door: asyncio.Server | None = None
        self.port = 0
        self.metrics_port: int | None = None
        self._is_draining = False
        self._has_been_ready = False  # see gateway.readiness
        self._health_task: asyncio.Task | None = None
        self._discovery_task: asyncio.Task | None = None
        self._is_ready = False  # the readiness health "" reports (the HTTP API's /health says the same)
        self.http: OpenAIServer | None = None
        self.http_port: int | None = None

    def _add_local_services(self) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.local_services)
        # The descriptors come from the generated modules (imported above), so reflection works.
        assert generate_pb2.DESCRIPTOR and control_pb2.DESCRIPTOR
        health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        reflection.enable_server_reflection((*SERVICES, health_name, reflection.SERVICE_NAME), self.local_services)

    async def start(self) -> int:
        """Bind, start serving and watching engines; return the bound port."""
        ensure_bindable(self.config.host, self.config.port, "--port")
        self._add_local_services()
        for service in ("", *SERVICES):
            await self.health.set(service, _NOT_SERVING)
        await self.health.set(LIVENESS_SERVICE, _SERVING)
        self.pool.add_listener(self._on_engines_changed)
        local_port = self.local_services.add_insecure_port("127.0.0.1:0")
        await self.local_services.start()
        self.forwarder.local_services = UpstreamLink("127.0.0.1", local_port)
        try:
            await self._bind()
            await self._start_http()
        except ConfigError:
            if self.front_door is not None:
                self.front_door.close()
            await self.local_services.stop(grace=None)
            raise
        await self.pool.start()
        self._start_discovery()
        return self.port

    async def _start_http(self) -> None:
        """The OpenAI HTTP API (`--http-port`), its calls made through the same forwarder."""
        if self.config.http_port is None:
            return
        self.http = OpenAIServer(self.forwarder, self.pool, self.config, lambda: self._is_ready)
        try:
            self.http_port = await self.http.start()
        except OSError as error:
            port = self.config.http_port
            message = f"--http-port {port}: cannot bind {self.config.host}:{port} ({error.strerror})."
            raise ConfigError(message) from None

    def _start_discovery(self) -> None:
        """Look up `--engine-dns` names in the background (a slow nameserver must not delay start)."""
        config = self.config
        if not config.engine_dns_targets:
            return
        # A lookup may take up to the interval: the next one starts after it in any case.
        resolver = make_resolver(config.dns_server_address, config.engine_dns_interval_s)
        discovery = EngineDiscovery(config.engine_dns_targets, resolver, config.engine_dns_interval_s, self.pool)
        self._discovery_task = asyncio.get_running_loop().create_task(discovery.run(), name="engine discovery")

    async def _bind(self) -> None:
        """Listen for clients (and metrics); a port that cannot be bound is a ConfigError."""
        try:
            self.front_door = await listen(self.forwarder, self.config, self.connections)
        except OSError as error:
            address = f"{self.config.host}:{self.config.port}"
            raise ConfigError(f"--port {self.config.port}: cannot bind {address} ({error.strerror}).") from None
        except ssl.SSLError as error:
            raise ConfigError(f"--tls-cert/--tls-key: cannot be used for TLS ({error.reason}).") from None
        self.port = self.front_door.sockets[0].getsockname()[1]
        if self.config.metrics_port is not None:
            try:
                self.metrics_port = self.metrics.serve(self.config.host, self.config.metrics_port)
            except OSError as error:
                self.front_door.close()
                raise ConfigError(
                    f"--metrics-port {self.config.metrics_port}: cannot bind ({error.strerror})."
                ) from None

    def _on_engines_changed(self) -> None:
        pool = self.pool
        required = self.config.ready_data_parallel_size
        ready = is_ready(pool.routable_ranks(), pool.data_parallel_size, required, has_been_ready=self._has_been_ready)
        if ready and not self._has_been_ready:
            self._has_been_ready = True
            if required is not None:
                logger.info("all %d data parallel ranks passed the handshake: health is SERVING", required)
        self._is_ready = ready
        status = _SERVING if ready else _NOT_SERVING
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
        self._is_ready = False
        started = time.monotonic()
        logger.info("draining: health NOT_SERVING, grace %.1fs", self.config.drain_grace_s)
        await self.health.enter_graceful_shutdown()
        await asyncio.sleep(self.config.drain_grace_s)
        self.forwarder.is_refusing = True
        deadline = started + self.config.shutdown_timeout_s
        logger.info("refusing new calls; waiting for %d in flight", self.forwarder.num_in_flight)
        while self.forwarder.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.forwarder.num_in_flight:
            logger.warning("shutdown timeout: cancelling %d calls in flight", self.forwarder.num_in_flight)
        await self.stop()

    async def stop(self) -> None:
        """Stop at once: in-flight calls end with UNAVAILABLE, and their upstream calls are reset."""
        if self.front_door is not None:
            self.front_door.close()
        self.forwarder.cancel_all()
        if self.http is not None:
            await self.http.stop()
        for connection in list(self.connections):
            connection.close()
        if self.forwarder.local_services is not None:
            self.forwarder.local_services.close()
        await self.local_services.stop(grace=None)
        if self._discovery_task is not None:
            self._discovery_task.cancel()
            await asyncio.gather(self._discovery_task, return_exceptions=True)
        await self.pool.close()
        await asyncio.sleep(0)  # let the transports flush their last frames


def cache_aware_weights(config: GatewayConfig) -> CacheAwareWeights:
    return CacheAwareWeights(
        prefill_weight=config.cache_prefill_weight,
        load_weight=config.cache_load_weight,
        balance_ratio=config.cache_balance_ratio,
        balance_slack=config.cache_balance_slack,
    )
