"""The engines behind one gateway: handshake, continuous health watching, and routing snapshots.

One watcher task per engine probes it every health interval (sooner when a forwarded call saw it
fail): first the handshake (GetServerInfo, checked by `gateway.handshake`), then grpc.health.v1
Check and GetLoad. An engine that went unhealthy handshakes again when it answers, because a
restarted engine is a new process that may report a different rank or model; passing that
handshake also closes its circuit breaker, so it takes calls again within one health interval.

Engines found by DNS (`gateway.discovery`) come and go through `set_discovered`. A new address
gets a client and a watcher like a configured one. A vanished one is retired: it leaves routing
and the handshake's view at once (so a replacement may take its rank), its watcher stops, and its
client stays open until the calls in flight on it have finished; then it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection

import grpc

from gateway.config import GatewayConfig
from gateway.engine_client import EngineClient
from gateway.handshake import check_engine
from gateway.health_state import PROBE_AT_ONCE, Blame, CallEvent, HealthStatus, blame_for
from gateway.kv_watch import KvWatch
from gateway.metrics import GatewayMetrics
from gateway.prompt_tokenizers import PromptTokenizers
from gateway.routing import EngineView
from gateway.routing.in_flight import AnnouncedPrefixes, InFlightPrefixes
from gateway.routing.kv_index import KvIndex

logger = logging.getLogger("dpgate.gateway.engines")
# How often a retired engine is checked for its last call in flight to end.
_RETIRE_POLL_S = 0.05


def _name(engine: EngineClient) -> str:
    return f"engine {engine.address}" if engine.rank is None else f"engine {engine.address} (rank {engine.rank})"


class EnginePool:
    """All configured engines; `snapshot()` lists the connected ones for routing."""

    def __init__(self, config: GatewayConfig, metrics: GatewayMetrics) -> None:
        self._config = config
        self._metrics = metrics
        self.engines = [EngineClient(f"{host}:{port}", config) for host, port in config.engine_addresses]
        self.by_address = {engine.address: engine for engine in self.engines}
        self._configured = frozenset(self.by_address)  # --engine addresses: never retired
        # Engines that left DNS and still finish calls; Abort still reaches them.
        self.retiring: list[EngineClient] = []
        self._watchers: dict[str, asyncio.Task] = {}
        self._retirements: set[asyncio.Task] = set()
        self._listeners: list[Callable[[], None]] = []
        # The exact prefix-cache index, fed by every connected engine's WatchKvEvents stream.
        self.kv_index = KvIndex()
        # Prefixes on their way into a cache: this gateway's open calls (gateway/prompt_routing.py
        # adds them) and the prompts the engines announce as queued (the event stream adds them).
        self.in_flight_prefixes = InFlightPrefixes()
        self.kv_watch = KvWatch(
            self.kv_index,
            retry_s=min(0.5, config.health_interval_s),
            lag=metrics.kv_event_lag,
            announced=AnnouncedPrefixes(self.in_flight_prefixes),
        )
        metrics.watch_kv_index(self._index_sizes)
        # The engines' tokenizers by fingerprint, learned once each (GetTokenizer).
        self.prompt_tokenizers = PromptTokenizers()
        self._learning: set[asyncio.Task] = set()

    def _index_sizes(self) -> list[tuple[int, str, int, int]]:
        announced = self.kv_watch.announced
        return [
            (e.rank, e.address, self.kv_index.num_blocks(e.address), announced.num_pending(e.address))
            for e in self.engines
            if e.rank is not None
        ]

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` whenever any engine's health or serving state changes."""
        self._listeners.append(listener)

    def snapshot(self) -> list[EngineView]:
        now = time.monotonic()
        return [engine.view(now) for engine in self.engines if engine.identity is not None]

    @property
    def data_parallel_size(self) -> int | None:
        """The DP size the connected engines reported (the handshake makes them agree), or None."""
        for engine in self.engines:
            if engine.identity is not None:
                return engine.identity.data_parallel_size
        return None

    def routable_ranks(self) -> set[int]:
        """Ranks of the connected engines that are healthy and serving (health's view, not the breaker's)."""
        return {
            engine.identity.rank
            for engine in self.engines
            if engine.identity is not None and engine.health.is_healthy and engine.is_serving
        }

    def connected(self) -> list[EngineClient]:
        return [engine for engine in self.engines if engine.identity is not None]

    # --- outcomes of forwarded calls ----------------------------------------------------------

    def record_outcome(self, engine: EngineClient, outcome: str | CallEvent) -> Blame:
        """Feed a forwarded call's outcome (a status code name or a CallEvent) to the engine's breaker.

        This is the one place `BREAKER_BLAME` is applied: a success closes the circuit, the
        engine's own failure counts against it, and anything else leaves it as it is.
        """
        blame = blame_for(outcome)
        if blame is Blame.NONE:
            changed = engine.breaker.record_success()
        elif blame is Blame.ENGINE:
            changed = engine.breaker.record_failure(time.monotonic())
        else:
            changed = False
        if changed:
            self._circuit_changed(engine)
        if outcome in PROBE_AT_ONCE:
            engine.wake.set()
        return blame

    def _circuit_changed(self, engine: EngineClient) -> None:
        state = engine.breaker.state
        logger.warning("%s circuit is now %s", _name(engine), state.value)
        if engine.rank is not None:
            self._metrics.set_circuit_state(engine.rank, engine.address, state)

    # --- watching -----------------------------------------------------------------------------

    async def start(self) -> None:
        for engine in self.engines:
            self._start_watching(engine)

    def _start_watching(self, engine: EngineClient) -> None:
        task = asyncio.get_running_loop().create_task(self._watch(engine), name=f"watch {engine.address}")
        self._watchers[engine.address] = task

    async def close(self) -> None:
        tasks = [*self._watchers.values(), *self._retirements]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.kv_watch.close()
        for task in self._learning:
            task.cancel()
        await asyncio.gather(*self._learning, return_exceptions=True)
        engines = [*self.engines, *self.retiring]
        await asyncio.gather(*(engine.close() for engine in engines), return_exceptions=True)

    # --- engines found by DNS -----------------------------------------------------------------

    def set_discovered(self, addresses: Collection[str]) -> None:
        """Make the discovered engines exactly `addresses` (`HOST:PORT`); configured ones always stay.

        Retirements run before additions, so an engine that came back at a new address (a
        rescheduled pod) never meets its own old self in the handshake's duplicate-rank rule.
        """
        wanted = set(addresses)
        for engine in list(self.engines):
            if engine.address not in wanted and engine.address not in self._configured:
                self._retire(engine)
        for address in sorted(wanted - self.by_address.keys()):
            engine = EngineClient(address, self._config)
            self.engines.append(engine)
            self.by_address[address] = engine
            logger.info("engine %s found by DNS", address)
            self._start_watching(engine)

    def _retire(self, engine: EngineClient) -> None:
        self.engines.remove(engine)
        del self.by_address[engine.address]
        self._watchers.pop(engine.address).cancel()
        self.kv_watch.stop(engine.address)
        self.retiring.append(engine)
        logger.info("%s left DNS: retiring it after its %d calls in flight", _name(engine), engine.num_in_flight)
        task = asyncio.get_running_loop().create_task(self._finish_retiring(engine), name=f"retire {engine.address}")
        self._retirements.add(task)
        task.add_done_callback(self._retirements.discard)
        if engine.identity is not None:
            self._notify()

    async def _finish_retiring(self, engine: EngineClient) -> None:
        while engine.num_in_flight:
            await asyncio.sleep(_RETIRE_POLL_S)
        self.retiring.remove(engine)
        if engine.rank is not None and engine.address not in self.by_address:  # not back under the same address
            self._metrics.forget_engine(engine.rank, engine.address)
        logger.info("%s retired", _name(engine))
        await engine.close()

    async def _watch(self, engine: EngineClient) -> None:
        while True:
            engine.wake.clear()
            try:
                await self._probe(engine)
            except Exception:  # a bug here must not stop watching the engine
                logger.exception("probing %s failed unexpectedly", _name(engine))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(engine.wake.wait(), self._config.health_interval_s)

    async def _probe(self, engine: EngineClient) -> None:
        timeout = self._config.health_timeout_s
        try:
            needs_handshake = engine.identity is None or not engine.health.is_healthy
            if needs_handshake and not await self._handshake(engine, timeout):
                return
            is_serving = await engine.check_serving(timeout)
            if is_serving:
                await engine.refresh_load(timeout)
        except grpc.aio.AioRpcError as error:
            self._probe_failed(engine)
            # A channel without a connection is replaced, and so is one whose probes time out while
            # the engine is unhealthy: its connection may be silent (a host cut off sends no RST),
            # and TCP's retransmission backoff would keep it dead long after the link returns. A
            # connected channel whose engine answers is kept: it may still carry calls (an engine
            # draining answers probes with UNAVAILABLE but finishes them).
            is_silent = error.code() is grpc.StatusCode.DEADLINE_EXCEEDED and not engine.health.is_healthy
            if is_silent or engine.channel.get_state() is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                engine.reconnect()
            return
        self._probe_succeeded(engine, is_serving)

    async def _handshake(self, engine: EngineClient, timeout: float) -> bool:
        """Ask the engine who it is and accept or refuse it; False when it is not (or no longer) usable."""
        identity = await engine.fetch_identity(timeout)
        accepted = [other.identity for other in self.engines if other.identity is not None]
        refusal = check_engine(identity, accepted)
        if refusal is not None:
            if engine.refusal != refusal:
                logger.error("refused %s", refusal.message)
                self._metrics.engines_refused.labels(reason=refusal.reason.value).inc()
            was_connected = engine.identity is not None
            engine.identity, engine.refusal = None, refusal
            self.kv_watch.stop(engine.address)
            if was_connected:
                self._notify()
            return False
        if engine.identity != identity:
            logger.info(
                "engine %s connected: data parallel rank %d of %d, model %r",
                engine.address,
                identity.rank,
                identity.data_parallel_size,
                identity.model,
            )
        engine.accept(identity)
        if identity.prefix_caching:
            self.kv_watch.start(engine)
            self._learn_tokenizer(engine, identity.tokenizer_fingerprint)
        else:
            self.kv_watch.stop(engine.address)
        if engine.breaker.reset():
            logger.info("%s circuit is now closed (new handshake)", _name(engine))
        self._metrics.set_circuit_state(identity.rank, engine.address, engine.breaker.state)
        return True

    def _learn_tokenizer(self, engine: EngineClient, fingerprint: str) -> None:
        """Fetch the engine's tokenizer in the background unless known, retrying every health
        interval while the engine stays connected (until then its calls are routed by load)."""
        tokenizers = self.prompt_tokenizers
        if not fingerprint or tokenizers.knows(fingerprint) or tokenizers.is_learning(fingerprint):
            return
        timeout = max(10.0, self._config.health_timeout_s)  # tens of MB for a large vocabulary

        async def learn() -> None:
            while engine.identity is not None and not tokenizers.knows(fingerprint):
                try:
                    await tokenizers.learn(fingerprint, lambda: engine.fetch_tokenizer(timeout))
                except grpc.aio.AioRpcError as error:
                    logger.warning("could not fetch the tokenizer of %s: %s", _name(engine), error.code().name)
                if not tokenizers.knows(fingerprint):
                    await asyncio.sleep(self._config.health_interval_s)

        task = asyncio.get_running_loop().create_task(learn(), name=f"tokenizer {engine.address}")
        self._learning.add(task)
        task.add_done_callback(self._learning.discard)

    def _probe_failed(self, engine: EngineClient) -> None:
        # is_serving keeps the engine's last answer: only the failure threshold takes it out.
        was_unknown = engine.health.status is HealthStatus.UNKNOWN
        if engine.health.record_failure():
            if was_unknown:  # never seen yet: most likely still starting
                logger.info("%s is not reachable yet", _name(engine))
            else:
                logger.warning("%s is unhealthy", _name(engine))
                # Its calls in flight end now if their connection is silent, not at their deadline.
                engine.link.check_alive(self._config.health_timeout_s)
            self._publish_health(engine)

    def _probe_succeeded(self, engine: EngineClient, is_serving: bool) -> None:
        changed = engine.health.record_success() or engine.is_serving != is_serving
        engine.is_serving = is_serving
        if changed:
            state = "serving" if is_serving else "reachable but not serving"
            logger.info("%s is healthy, %s", _name(engine), state)
            self._publish_health(engine)

    def _publish_health(self, engine: EngineClient) -> None:
        if engine.rank is not None:
            self._metrics.set_engine_health(engine.rank, engine.address, engine.health.is_healthy)
        self._notify()

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()
