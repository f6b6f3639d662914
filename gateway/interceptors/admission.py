"""Admission: refuses new calls while the gateway drains, and beyond the in-flight limit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc import aio

from gateway.interceptors.handlers import is_dpgate_method, refusing_handler

DRAINING_MESSAGE = "gateway is shutting down; retry on another gateway"


@dataclass(slots=True)
class Admission:
    """Shared switch between the drain sequence and the interceptor.

    `num_in_flight` reads the forwarder's live count; `max_in_flight` None means no limit.
    """

    num_in_flight: Callable[[], int]
    max_in_flight: int | None = None
    is_refusing: bool = False


class AdmissionInterceptor(aio.ServerInterceptor):
    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        if admission.max_in_flight is not None:
            self._full_message = f"gateway is at its limit of {admission.max_in_flight} calls in flight"

    async def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        admission = self._admission
        if not is_dpgate_method(handler_call_details.method):
            return await continuation(handler_call_details)
        if admission.is_refusing:
            code, message = grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE
        elif admission.max_in_flight is not None and admission.num_in_flight() >= admission.max_in_flight:
            code, message = grpc.StatusCode.RESOURCE_EXHAUSTED, self._full_message
        else:
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        streaming = handler is not None and handler.response_streaming
        return refusing_handler(streaming, code, message)
