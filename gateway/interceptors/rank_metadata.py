"""Reads `x-data-parallel-rank` before anything else can contact an engine (front door rule 1)."""

from __future__ import annotations

import grpc
from grpc import aio

from gateway.call_context import pinned_rank
from gateway.errors import InvalidArgument
from gateway.interceptors.handlers import is_dpgate_method, refusing_handler
from gateway.metadata import RANK_KEY, parse_data_parallel_rank
from gateway.metrics import GatewayMetrics


class RankMetadataInterceptor(aio.ServerInterceptor):
    """Parses the pin into `call_context.pinned_rank`, or refuses the call with INVALID_ARGUMENT."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._rejected = metrics.rejected_metadata.labels(key=RANK_KEY)

    async def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        if not is_dpgate_method(handler_call_details.method):
            return await continuation(handler_call_details)
        try:
            rank = parse_data_parallel_rank(handler_call_details.invocation_metadata)
        except InvalidArgument as error:
            self._rejected.inc()
            handler = await continuation(handler_call_details)
            streaming = handler is not None and handler.response_streaming
            return refusing_handler(streaming, grpc.StatusCode.INVALID_ARGUMENT, error.message)
        pinned_rank.set(rank)
        return await continuation(handler_call_details)
