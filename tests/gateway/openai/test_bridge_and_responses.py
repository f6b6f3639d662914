"""The HTTP side's seam and builders, without processes: an EngineCall reassembles the relayed
messages however the bytes are cut and returns the window as each is taken; a front-door refusal
becomes its status; statuses map to OpenAI's HTTP errors; stream messages become chunks."""

from __future__ import annotations

import asyncio

import grpc

from dpgate.v1 import generate_pb2 as pb
from gateway.config import GatewayConfig
from gateway.engine_pool import EnginePool
from gateway.forwarding import Forwarder
from gateway.grpc_wire import frame_message, status_trailers
from gateway.metadata import RANK_ERROR_MESSAGE
from gateway.metrics import GatewayMetrics
from gateway.openai import responses
from gateway.openai.bridge import EngineCall
from gateway.openai.errors import error_for_status
from gateway.routing.policies import make_policy


class Handler:
    def __init__(self) -> None:
        self.sent: list[int] = []
        self.request = b""
        self.cancelled = False

    def on_request_data(self, data: bytes, end_stream: bool) -> None:
        self.request += data

    def on_response_sent(self, num_bytes: int) -> None:
        self.sent.append(num_bytes)

    def on_cancelled(self) -> None:
        self.cancelled = True


class Opener:
    def __init__(self, refuse: bool = False) -> None:
        self.handler = Handler()
        self.refuse = refuse

    def open_call(self, call: EngineCall, end_stream: bool) -> None:
        if self.refuse:
            call.refuse(grpc.StatusCode.INVALID_ARGUMENT, RANK_ERROR_MESSAGE)
        else:
            call.handler = self.handler


async def drain(call: EngineCall) -> list[bytes]:
    return await call.collect()


def test_messages_cut_anywhere_are_reassembled_and_the_window_comes_back_per_message():
    async def run() -> None:
        opener = Opener()
        call = EngineCall([(b":path", b"/dpgate.v1.InferenceService/GenerateStream")])
        call.start(opener, b"request")
        assert opener.handler.request == frame_message(b"request")
        wire = frame_message(b"one") + frame_message(b"") + frame_message(b"three!")
        for index in range(0, len(wire), 3):
            call.send(wire[index : index + 3])
        call.finish(status_trailers(grpc.StatusCode.OK))
        assert await drain(call) == [b"one", b"", b"three!"]
        assert opener.handler.sent == [8, 5, 11] and call.status.code is grpc.StatusCode.OK

    asyncio.run(run())


def test_a_refusal_at_the_front_door_is_the_calls_status():
    async def run() -> None:
        call = EngineCall([])
        call.start(Opener(refuse=True), b"")
        assert await drain(call) == []
        assert call.status.code is grpc.StatusCode.INVALID_ARGUMENT
        assert call.status.message == RANK_ERROR_MESSAGE

    asyncio.run(run())


def test_cancel_reaches_the_relay_once():
    async def run() -> None:
        opener = Opener()
        call = EngineCall([])
        call.start(opener, b"")
        call.cancel()
        assert opener.handler.cancelled

    asyncio.run(run())


def test_statuses_map_to_the_http_errors_openai_clients_read():
    cases = {
        grpc.StatusCode.INVALID_ARGUMENT: 400,
        grpc.StatusCode.UNAUTHENTICATED: 401,
        grpc.StatusCode.NOT_FOUND: 404,
        grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
        grpc.StatusCode.UNAVAILABLE: 503,
        grpc.StatusCode.DEADLINE_EXCEEDED: 504,
        grpc.StatusCode.INTERNAL: 500,
    }
    for code, status in cases.items():
        answer = error_for_status(code, "why")
        assert answer.status == status and answer.body()["error"]["message"] == "why"
        assert ("Retry-After" in answer.headers()) == (status in (429, 503))


def test_a_unary_chat_with_tool_calls_finishes_with_tool_calls_and_counts_the_prompt_once():
    finish = pb.FinishInfo(reason=pb.FINISH_REASON_STOP, num_prompt_tokens=10, num_generated_tokens=4, stop_token_id=2)
    call = pb.ToolCall(id="call_0", name="f", arguments="{}")
    answers = [pb.ChatResponse(tool_calls=[call], finish=finish), pb.ChatResponse(content="hi", finish=finish)]
    body = responses.chat_completion("r", "m", 1, answers, logprobs=False)
    first, second = body["choices"]
    assert first["finish_reason"] == "tool_calls" and first["message"]["content"] is None
    function = {"name": "f", "arguments": "{}"}
    assert first["message"]["tool_calls"] == [{"id": "call_0", "type": "function", "function": function}]
    assert second["finish_reason"] == "stop" and second["stop_reason"] == 2
    assert body["usage"]["prompt_tokens"] == 10 and body["usage"]["completion_tokens"] == 8


def test_stream_messages_become_chunks_with_logprobs_as_token_ids():
    chunks = responses.ChatChunks(1, logprobs=True)
    prompt = pb.ChatStreamResponse(prompt_info=pb.PromptInfo(prompt_token_ids=[1]))
    assert chunks.feed(prompt.SerializeToString())[0]["delta"] == {"role": "assistant", "content": ""}
    logprob = pb.TokenLogprob(token_id=7, logprob=-0.5, top_logprobs=[pb.TopLogprob(token_id=7, logprob=-0.5)])
    delta = pb.ChatStreamResponse(delta=pb.ChatDelta(content="Hi", token_ids=[7], logprobs=[logprob]))
    (choice,) = chunks.feed(delta.SerializeToString())
    assert choice["index"] == 1 and choice["delta"] == {"content": "Hi"}
    assert choice["logprobs"]["content"][0]["token"] == "token_id:7"
    markup = pb.ChatStreamResponse(delta=pb.ChatDelta(token_ids=[8], logprobs=[pb.TokenLogprob(token_id=8)]))
    assert chunks.feed(markup.SerializeToString())[0]["delta"] == {}
    end = pb.ChatStreamResponse(finish=pb.FinishInfo(reason=pb.FINISH_REASON_LENGTH))
    assert chunks.feed(end.SerializeToString())[0]["finish_reason"] == "length"


def test_logprobs_carry_the_engines_token_text_and_bytes_with_offsets_across_chunks():
    def entry(token_id: int, text: str) -> pb.TokenLogprob:
        raw = text.encode()
        top = pb.TopLogprob(token_id=token_id, logprob=-0.25, token=text, token_bytes=raw)
        return pb.TokenLogprob(token_id=token_id, logprob=-0.25, token=text, token_bytes=raw, top_logprobs=[top])

    (chat_entry,) = responses.chat_logprobs([entry(5, " Zü")])
    assert chat_entry["token"] == " Zü" and chat_entry["bytes"] == [32, 90, 195, 188]
    assert chat_entry["top_logprobs"] == [{"token": " Zü", "logprob": -0.25, "bytes": [32, 90, 195, 188]}]
    partial = pb.TokenLogprob(token_id=9, token="\ufffd", token_bytes=b"\xe6")
    assert responses.chat_logprobs([partial])[0]["bytes"] == [0xE6]  # OpenAI's bytes: the token's own
    chunks = responses.CompletionChunks(0, logprobs=True)
    first = pb.Delta(text="Paris is", token_ids=[1, 2], logprobs=[entry(1, "Paris"), entry(2, " is")])
    second = pb.Delta(text=" big", token_ids=[3], logprobs=[entry(3, " big")])
    (one,) = chunks.feed(pb.GenerateStreamResponse(delta=first).SerializeToString())
    (two,) = chunks.feed(pb.GenerateStreamResponse(delta=second).SerializeToString())
    assert one["logprobs"]["tokens"] == ["Paris", " is"] and one["logprobs"]["text_offset"] == [0, 5]
    assert two["logprobs"]["text_offset"] == [8] and two["logprobs"]["top_logprobs"] == [{" big": -0.25}]


def test_a_streamed_completion_counts_its_tokens_for_continuous_usage():
    chunks = responses.CompletionChunks(0, logprobs=False)
    chunks.feed(pb.GenerateStreamResponse(prompt_info=pb.PromptInfo(prompt_token_ids=[1, 2, 3])).SerializeToString())
    chunks.feed(pb.GenerateStreamResponse(delta=pb.Delta(text="ab", token_ids=[4, 5])).SerializeToString())
    assert chunks.usage_so_far() == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_the_end_of_a_call_stays_the_end():
    async def run() -> None:
        call = EngineCall([])
        call.start(Opener(refuse=True), b"")
        assert await call.next_message() is None
        assert await call.next_message() is None  # a second reader (or a late one) sees the end too

    asyncio.run(run())


def test_the_forwarder_refuses_an_http_call_for_a_method_outside_dpgate_v1():
    """Only a gRPC client's call is relayed to the gateway's own services (health, reflection)."""

    async def run() -> None:
        config = GatewayConfig(engines=("127.0.0.1:1",))
        metrics = GatewayMetrics()
        forwarder = Forwarder(EnginePool(config, metrics), make_policy(config.policy), metrics, config)
        call = EngineCall([(b":path", b"/grpc.health.v1.Health/Check")])
        call.start(forwarder, b"")
        assert await call.collect() == []
        assert call.status.code is grpc.StatusCode.UNIMPLEMENTED
        assert "/grpc.health.v1.Health/Check is not a dpgate.v1 method" in call.status.message

    asyncio.run(run())
