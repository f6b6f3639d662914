"""The forwarding servicer: chooses an engine for each call and relays raw bytes both ways.

Bodies are never parsed (except the small Abort fan-out), the client's deadline becomes the
upstream timeout, and a client that cancels or disconnects cancels the handler task, whose
`finally` cancels the upstream call so the engine stops the request. Unpinned calls that fail with
UNAVAILABLE before anything reached the client are retried once on another engine; nothing is
retried once a message was relayed. The serving rank goes back in trailing metadata.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from grpc import aio
from prometheus_client import Counter

from dpgate.v1 import control_pb2
from gateway.call_context import pinned_rank
from gateway.engine_client import EngineClient
from gateway.engine_pool import EnginePool
from gateway.errors import EngineFailed, GatewayError, Unavailable
from gateway.metrics import GatewayMetrics
from gateway.routing import RouteRequest, RoutingPolicy, choose_engine_for_request
from gateway.status_table import ENGINE_FAILURE_CODES, status_for

logger = logging.getLogger("dpgate.gateway.forwarding")

# A serialized GenerateStreamResponse holds one oneof field; its first byte is the field's tag.
# Field 2 (delta), wire type 2: (2 << 3) | 2. Reading one byte tells a token from prompt info.
_DELTA_TAG = b"\x12"


class Forwarder:
    """Serves dpgate.v1 calls by forwarding each to one engine of the pool."""

    def __init__(self, pool: EnginePool, policy: RoutingPolicy, metrics: GatewayMetrics) -> None:
        self._pool = pool
        self._policy = policy
        self._metrics = metrics
        self.num_in_flight = 0
        self._routed_counters: dict[str, Counter] = {}

    def _routed(self, engine: EngineClient) -> Counter:
        """The routed-requests counter of `engine`'s rank (label lookups cost more than the increment)."""
        rank = engine.rank_metadata[0][1]
        counter = self._routed_counters.get(rank)
        if counter is None:
            counter = self._routed_counters[rank] = self._metrics.routed.labels(rank=rank)
        return counter

    def _choose(self, rank: int | None, excluded: frozenset[str]) -> EngineClient:
        request = RouteRequest(rank=rank, excluded_addresses=excluded)
        view = choose_engine_for_request(self._pool.snapshot(), request, self._policy)
        return self._pool.by_address[view.address]

    def _failure(self, engine: EngineClient, error: aio.AioRpcError, num_sent: int) -> EngineFailed:
        """The status the client gets for an engine's failure; never internal addresses or tracebacks."""
        code = error.code()
        if num_sent and code in ENGINE_FAILURE_CODES:
            message = f"data parallel rank {engine.rank} failed after {num_sent} messages were sent"
            return EngineFailed("INTERNAL", message)
        if code is grpc.StatusCode.UNAVAILABLE:
            return EngineFailed("UNAVAILABLE", f"data parallel rank {engine.rank} is unavailable")
        return EngineFailed(code.name, error.details() or code.name)

    async def _abort(self, context: aio.ServicerContext, error: BaseException) -> None:
        code, message = status_for(error)
        if not isinstance(error, GatewayError):
            logger.exception("unexpected error while forwarding", exc_info=error)
        await context.abort(code, message)

    # --- unary calls --------------------------------------------------------------------------

    def unary_behavior(self, method: str):
        """The handler for one unary method, forwarding raw request bytes to `method`."""

        async def forward(request: bytes, context: aio.ServicerContext) -> bytes:
            try:
                return await self._forward_unary(method, request, context)
            except Exception as error:  # every failure becomes a status via the one table
                await self._abort(context, error)
                raise  # unreachable: abort raises

        return forward

    async def _forward_unary(self, method: str, request: bytes, context: aio.ServicerContext) -> bytes:
        rank = pinned_rank.get()
        excluded: frozenset[str] = frozenset()
        num_attempts = 1 if rank is not None else 2
        self.num_in_flight += 1
        try:
            for attempt in range(num_attempts):
                engine = self._choose(rank, excluded)
                context.set_trailing_metadata(engine.rank_metadata)
                call = engine.unary[method](request, timeout=context.time_remaining())
                engine.num_in_flight += 1
                try:
                    response = await call
                except aio.AioRpcError as error:
                    self._pool.record_failure(engine, error.code())
                    if attempt + 1 < num_attempts and error.code() is grpc.StatusCode.UNAVAILABLE:
                        excluded |= {engine.address}
                        self._metrics.retries.labels(rpc=method).inc()
                        continue
                    raise self._failure(engine, error, 0) from None
                finally:
                    engine.num_in_flight -= 1
                    if not call.done():
                        call.cancel()
                self._pool.record_success(engine)
                self._routed(engine).inc()
                return response
            raise AssertionError("unreachable: the last attempt returns or raises")
        finally:
            self.num_in_flight -= 1

    # --- streaming ----------------------------------------------------------------------------

    async def generate_stream(self, request: bytes, context: aio.ServicerContext) -> None:
        try:
            await self._forward_stream(request, context)
        except Exception as error:
            await self._abort(context, error)

    async def _forward_stream(self, request: bytes, context: aio.ServicerContext) -> None:
        rank = pinned_rank.get()
        start = time.perf_counter()
        excluded: frozenset[str] = frozenset()
        num_attempts = 1 if rank is not None else 2
        self.num_in_flight += 1
        try:
            for attempt in range(num_attempts):
                engine = self._choose(rank, excluded)
                context.set_trailing_metadata(engine.rank_metadata)
                call = engine.generate_stream(request, timeout=context.time_remaining())
                engine.num_in_flight += 1
                num_sent = 0
                is_first_token = True
                try:
                    async for message in call:
                        if is_first_token and message[:1] == _DELTA_TAG:
                            is_first_token = False
                            self._metrics.ttft.observe(time.perf_counter() - start)
                        await context.write(message)
                        num_sent += 1
                except aio.AioRpcError as error:
                    self._pool.record_failure(engine, error.code())
                    retryable = error.code() is grpc.StatusCode.UNAVAILABLE and num_sent == 0
                    if retryable and attempt + 1 < num_attempts:
                        excluded |= {engine.address}
                        self._metrics.retries.labels(rpc="GenerateStream").inc()
                        continue
                    raise self._failure(engine, error, num_sent) from None
                finally:
                    engine.num_in_flight -= 1
                    if not call.done():
                        call.cancel()
                self._pool.record_success(engine)
                self._routed(engine).inc()
                return
        finally:
            self.num_in_flight -= 1

    # --- Abort fans out -----------------------------------------------------------------------

    async def abort(self, request: bytes, context: aio.ServicerContext) -> bytes:
        """Abort: pinned goes to its rank; unpinned goes to every usable engine, answers merged.

        The gateway does not remember which engine serves which request id, so an unpinned
        Abort asks them all; engines ignore ids they do not know.
        """
        try:
            if pinned_rank.get() is not None:
                return await self._forward_unary("Abort", request, context)
            return await self._abort_everywhere(request, context)
        except Exception as error:
            await self._abort(context, error)
            raise

    async def _abort_everywhere(self, request: bytes, context: aio.ServicerContext) -> bytes:
        engines = [e for e in self._pool.connected() if e.health.is_healthy]
        if not engines:
            raise Unavailable("no engine can serve the request: every candidate is not healthy")
        timeout = context.time_remaining()
        results = await asyncio.gather(
            *(engine.unary["Abort"](request, timeout=timeout) for engine in engines), return_exceptions=True
        )
        aborted: list[str] = []
        for engine, result in zip(engines, results, strict=True):
            if isinstance(result, aio.AioRpcError):
                raise self._failure(engine, result, 0)
            if isinstance(result, BaseException):
                raise result
            aborted.extend(control_pb2.AbortResponse.FromString(result).aborted_request_ids)
        return control_pb2.AbortResponse(aborted_request_ids=aborted).SerializeToString()
