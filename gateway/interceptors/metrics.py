"""Counts every dpgate.v1 call by rpc and final code, times it, and tracks calls in flight.

Wrapped handlers are cached per (method, inner handler): the inner handlers are themselves
long-lived (the servicer's, or a cached refusal), so wrapping costs one dict lookup per call.
"""

from __future__ import annotations

import asyncio
import time

import grpc
from grpc import aio
from prometheus_client import Counter, Histogram

from gateway.interceptors.handlers import is_dpgate_method
from gateway.metrics import GatewayMetrics


class MetricsInterceptor(aio.ServerInterceptor):
    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics
        self._wrapped: dict[tuple[str, int], grpc.RpcMethodHandler] = {}
        self._counters: dict[tuple[str, str], Counter] = {}
        self._durations: dict[str, Histogram] = {}

    async def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        method = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None or not is_dpgate_method(method):
            return handler
        key = (method, id(handler))
        wrapped = self._wrapped.get(key)
        if wrapped is None:
            wrapped = self._wrapped[key] = self._wrap(method.rsplit("/", 1)[-1], handler)
        return wrapped

    def _record(self, rpc: str, code: str, start: float) -> None:
        counter = self._counters.get((rpc, code))
        if counter is None:
            counter = self._counters[(rpc, code)] = self._metrics.requests.labels(rpc=rpc, code=code)
        counter.inc()
        duration = self._durations.get(rpc)
        if duration is None:
            duration = self._durations[rpc] = self._metrics.duration.labels(rpc=rpc)
        duration.observe(time.perf_counter() - start)
        self._metrics.in_flight.dec()

    def _wrap(self, rpc: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
        assert behavior is not None  # dpgate.v1 methods are all unary-request

        async def measured(request, context: aio.ServicerContext):
            start = time.perf_counter()
            self._metrics.in_flight.inc()
            code = "OK"
            try:
                return await behavior(request, context)
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except BaseException:
                status = context.code()
                code = status.name if isinstance(status, grpc.StatusCode) else "UNKNOWN"
                raise
            finally:
                self._record(rpc, code, start)

        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                measured, handler.request_deserializer, handler.response_serializer
            )
        return grpc.unary_unary_rpc_method_handler(
            measured, handler.request_deserializer, handler.response_serializer
        )
