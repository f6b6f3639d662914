"""An unpinned Abort always finishes (issue 22, item 7): when an engine's channel is closed while
its Abort is in flight (the health watcher drops a briefly unreachable engine), the awaited call
ends with CancelledError; that escaped `except Exception` and the call hung until the client gave
up (392 s). Each engine's result is now judged as that engine's answer or failure."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest

from dpgate.v1 import control_pb2
from gateway.errors import EngineFailed
from gateway.forwarded_call import merge_abort_results

RANK_0, RANK_1 = SimpleNamespace(rank=0), SimpleNamespace(rank=1)


def answer(*ids: str) -> bytes:
    return control_pb2.AbortResponse(aborted_request_ids=list(ids)).SerializeToString()


def test_answers_are_merged():
    assert merge_abort_results([RANK_0, RANK_1], [answer("a"), answer("b", "c")]) == ["a", "b", "c"]


def test_an_abort_cancelled_under_a_closed_channel_is_that_engine_being_unavailable():
    with pytest.raises(EngineFailed) as failed:
        merge_abort_results([RANK_0, RANK_1], [answer("a"), asyncio.CancelledError()])
    assert failed.value.code_name == "UNAVAILABLE"
    assert failed.value.message == "data parallel rank 1 is unavailable"


def test_an_engine_error_is_relayed_as_that_engines_failure():
    error = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")
    with pytest.raises(EngineFailed, match="data parallel rank 0 is unavailable"):
        merge_abort_results([RANK_0, RANK_1], [error, answer()])
