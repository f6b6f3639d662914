"""The fuzz verdict's rule, the raw calls' outcome labels and the load check's stream rule, without
servers; and the fuzz workload failing against a server that answers INTERNAL."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import grpc
import pytest

from dpgate.e2e import fuzz, fuzz_verdict
from dpgate.e2e.contracts import Target, Topology
from dpgate.e2e.fuzz_cases import KIND_SHARES, draw_cases
from dpgate.e2e.h2_wire import Frame
from dpgate.e2e.load import check_stream, percentile
from dpgate.e2e.raw_calls import outcome_of
from dpgate.v1 import generate_pb2
from gateway.http2 import frames as f


@pytest.mark.parametrize(
    "code", ["OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED", "DEADLINE_EXCEEDED"]
)
def test_documented_codes_pass(code):
    assert fuzz_verdict.problems(Counter({("fields", code): 3})) == []


# DEADLINE_EXCEEDED is documented when the client's own deadline passed (a long generation);
# before it, the sender labels it DEADLINE_EXCEEDED:early.
UNDOCUMENTED = ("INTERNAL", "UNKNOWN", "UNAVAILABLE", "DEADLINE_EXCEEDED:early", "FAILED_PRECONDITION",
                "goaway:INTERNAL_ERROR", "reset:PROTOCOL_ERROR", "closed", "client:OSError")  # fmt: skip


@pytest.mark.parametrize("code", UNDOCUMENTED)
def test_anything_else_fails_and_is_named(code):
    outcomes = Counter({("fields", "OK"): 100, ("garbage", code): 2})
    assert fuzz_verdict.problems(outcomes) == [f"2 garbage request(s) got {code}, which is not a documented answer"]


def test_a_cut_frame_may_only_end_the_connection_quietly_or_with_a_framing_goaway():
    for outcome in ("closed", "goaway:NO_ERROR", "goaway:PROTOCOL_ERROR", "goaway:FRAME_SIZE_ERROR", "OK"):
        assert fuzz_verdict.allowed("cut-http2-frame", outcome), outcome
    for outcome in ("goaway:INTERNAL_ERROR", "INTERNAL", "UNKNOWN", "no answer in time"):
        assert not fuzz_verdict.allowed("cut-http2-frame", outcome), outcome
    assert not fuzz_verdict.allowed("fields", "closed")


def test_codes_seen_sums_over_kinds():
    outcomes = Counter({("fields", "OK"): 5, ("garbage", "INVALID_ARGUMENT"): 7, ("fields", "INVALID_ARGUMENT"): 1})
    assert fuzz_verdict.codes_seen(outcomes) == {"INVALID_ARGUMENT": 8, "OK": 5}


def _headers(fields):
    return Frame(f.HEADERS, f.END_STREAM | f.END_HEADERS, 1, b"", fields)


def test_raw_outcome_labels():
    assert outcome_of(_headers([(b":status", b"200"), (b"grpc-status", b"3")]), closed=False) == "INVALID_ARGUMENT"
    assert outcome_of(_headers([(b"grpc-status", b"13")]), closed=False) == "INTERNAL"
    assert outcome_of(Frame(f.RST_STREAM, 0, 1, f.pack_rst_stream(1, f.STREAM_CLOSED)[9:]), False) == (
        "reset:STREAM_CLOSED"
    )
    assert outcome_of(Frame(f.GOAWAY, 0, 0, f.pack_goaway(0, f.INTERNAL_ERROR)[9:]), True) == "goaway:INTERNAL_ERROR"
    assert outcome_of(None, closed=True) == "closed"
    assert outcome_of(_headers([(b":status", b"200")]), closed=False) == "no grpc-status"


def _stream(*token_groups, generated=None, prompt=(1, 2)):
    messages = [generate_pb2.GenerateStreamResponse(prompt_info=generate_pb2.PromptInfo(prompt_token_ids=prompt))]
    for group in token_groups:
        text = "".join(f"<{token}>" for token in group)
        messages.append(generate_pb2.GenerateStreamResponse(delta=generate_pb2.Delta(text=text, token_ids=group)))
    count = sum(len(group) for group in token_groups) if generated is None else generated
    finish = generate_pb2.FinishInfo(reason=generate_pb2.FINISH_REASON_LENGTH, num_prompt_tokens=len(prompt),
                                     num_generated_tokens=count)  # fmt: skip
    return [*messages, generate_pb2.GenerateStreamResponse(finish=finish)]


EXPECTED = generate_pb2.GenerateResponse(
    text="<5><6><7>", token_ids=[5, 6, 7], finish=generate_pb2.FinishInfo(reason=generate_pb2.FINISH_REASON_LENGTH)
)


def test_a_stream_matching_the_engine_passes_however_its_deltas_are_cut():
    assert check_stream(_stream([5, 6, 7]), EXPECTED) is None
    assert check_stream(_stream([5], [6, 7]), EXPECTED) is None


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        (_stream([5, 6], [6, 7]), "differ"),  # a token delivered twice
        (_stream([5], [7]), "differ"),  # a gap
        (_stream([6, 5, 7]), "differ"),  # out of order
        (_stream([5, 6, 7], generated=4), "finish counts 4"),
        (_stream([5, 6, 7])[:-1], "not prompt_info, deltas, finish"),  # no finish
        (_stream([5, 6, 7])[1:], "not prompt_info, deltas, finish"),  # no prompt info
    ],
)
def test_a_stream_with_duplicates_gaps_or_a_wrong_shape_fails(messages, words):
    assert words in check_stream(messages, EXPECTED)


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile([3.0], 0.99)) == (50.0, 99.0, 3.0)


def test_the_cases_are_reproducible():
    first, again = draw_cases(80, seed_value=7), draw_cases(80, seed_value=7)
    assert first == again and len(first) == 80
    kinds = Counter(case.kind for case in first)
    assert set(kinds) <= set(KIND_SHARES) and kinds.most_common(1)[0][0] == "fields"
    assert draw_cases(80, seed_value=8) != first


def _internal_server() -> tuple[str, callable]:
    """A gRPC server on its own thread that answers the fuzz workload's known-good Generate and
    INTERNAL to everything else: what a broken server looks like to the workload."""
    known = generate_pb2.GenerateResponse(token_ids=[1], text="x").SerializeToString()
    ready, address, loop = threading.Event(), [], asyncio.new_event_loop()

    async def handle(request: bytes, context) -> bytes:
        parsed = generate_pb2.GenerateRequest()
        try:
            parsed.ParseFromString(request)
        except Exception:  # a broken server: a body it cannot parse is INTERNAL below
            parsed.text = ""
        if parsed.text == fuzz.KNOWN_GOOD_PROMPT:
            return known
        await context.abort(grpc.StatusCode.INTERNAL, "boom")

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            return grpc.unary_unary_rpc_method_handler(handle)

    async def serve(stop: asyncio.Event) -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((Handler(),))
        address.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        await server.start()
        ready.set()
        await stop.wait()
        await server.stop(0)

    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(stop),), daemon=True)
    thread.start()
    ready.wait(10)
    return address[0], lambda: (loop.call_soon_threadsafe(stop.set), thread.join(10))


def test_the_fuzz_verdict_fails_when_a_server_answers_internal():
    address, stop = _internal_server()
    try:
        target = Target(gateway=address, engines=(), topology=Topology(dp=1), deadline=time.monotonic() + 60)
        result = fuzz.run(target, fuzz.FuzzPlan(requests=60, check_every=30, call_timeout_s=1.0, rfc_violations=False))
    finally:
        stop()
    assert not result.passed
    assert "got INTERNAL, which is not a documented answer" in result.detail
    assert result.figures["codes_seen"].get("INTERNAL", 0) > 0
