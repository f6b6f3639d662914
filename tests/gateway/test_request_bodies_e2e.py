"""Unfinished request bodies cannot hold the gateway (issue 22, item 8): a call whose body does not
arrive within --request-body-timeout is ended (20,000 headers-only streams stayed "in flight" for
over 60 s), and one peer may hold at most --max-in-flight-per-peer calls (with --max-in-flight 100,
one client holding 100 headers-only streams locked every other client out)."""

from __future__ import annotations

import time

from tests.gateway.raw_grpc import RawCall, message

GENERATE = "/dpgate.v1.InferenceService/Generate"
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED = 4, 8


def test_a_body_that_never_ends_is_ended_at_the_deadline(start_gateway):
    gateway = start_gateway("--request-body-timeout", "1")
    started = time.monotonic()
    call = RawCall(gateway.port, GENERATE)
    call.send(message(b"")[:3], end_stream=False)  # half a message prefix, then nothing
    answer = call.finish(timeout=10)
    elapsed = time.monotonic() - started
    assert answer.status == DEADLINE_EXCEEDED, answer
    assert "--request-body-timeout" in answer.message
    assert 0.8 < elapsed < 5, elapsed


def test_one_peer_cannot_take_every_in_flight_slot(start_gateway):
    gateway = start_gateway("--max-in-flight", "4", "--max-in-flight-per-peer", "2", "--request-body-timeout", "30")
    held = [RawCall(gateway.port, GENERATE) for _ in range(2)]  # headers only: in flight, waiting for a body
    time.sleep(0.3)
    third = RawCall(gateway.port, GENERATE)
    answer = third.finish(timeout=10)
    assert answer.status == RESOURCE_EXHAUSTED, answer
    assert "--max-in-flight-per-peer" in answer.message
    other = RawCall(gateway.port, GENERATE, source_host="127.0.0.2")  # another client is still served
    other.send(message(b"\x12\x05hello"))  # GenerateRequest(text="hello")
    assert other.finish(timeout=10).status == 0
    for call in held:
        call.close()
