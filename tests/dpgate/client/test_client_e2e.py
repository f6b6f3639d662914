"""dpgate.client.clients over real sockets: streams, rank pins, deadlines, API keys, TLS and mutual TLS.

Each behaviour is checked for the blocking and the asyncio client alike, since they promise the
same surface. Which rank served a call is read three independent ways: the gateway's trailing
metadata (`stream.rank`), the engine's own GetServerInfo answer, and the engines' call counters.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from dpgate.client import (
    AsyncDpgateClient,
    DpgateClient,
    DpgateError,
    FinishReason,
    GenerationOptions,
    TlsOptions,
    Usage,
)
from gateway.forwarding import UNAUTHENTICATED_MESSAGE
from tests.dpgate.conftest import API_KEY, SERVER_NAME, TOKEN_DELAY_S

FOUR_TOKENS = GenerationOptions(max_tokens=4, ignore_eos=True)
SLOW = GenerationOptions(max_tokens=200, ignore_eos=True)  # 2 s of tokens at the engine


def test_blocking_stream_yields_each_delta_then_the_finish(plain_gateway):
    with DpgateClient(plain_gateway.address, timeout=10) as client, client.stream("hello", FOUR_TOKENS) as stream:
        assert stream.finish is None
        deltas = list(stream)
    assert [(d.text, d.token_ids) for d in deltas] == [("x", (7,))] * 4
    assert stream.finish.reason is FinishReason.LENGTH
    assert stream.finish.usage == Usage(prompt_tokens=0, completion_tokens=4)
    assert stream.request_id == "r"
    assert stream.rank in (0, 1)


def test_async_stream_yields_each_delta_then_the_finish(plain_gateway):
    async def run():
        async with AsyncDpgateClient(plain_gateway.address, timeout=10) as client:
            stream = client.stream("hello", FOUR_TOKENS)
            deltas = [delta async for delta in stream]
            return deltas, stream

    deltas, stream = asyncio.run(run())
    assert [(d.text, d.token_ids) for d in deltas] == [("x", (7,))] * 4
    assert stream.finish.reason is FinishReason.LENGTH
    assert stream.finish.usage.completion_tokens == 4
    assert stream.rank in (0, 1)


def test_deltas_arrive_while_the_call_runs(plain_gateway):
    """The iterator hands out each delta when it arrives, not the lot at the end."""
    arrivals = []
    with DpgateClient(plain_gateway.address, timeout=10) as client:
        started = time.monotonic()
        for _ in client.stream("hello", GenerationOptions(max_tokens=30, ignore_eos=True)):
            arrivals.append(time.monotonic() - started)
    assert len(arrivals) == 30
    assert arrivals[-1] - arrivals[0] >= 25 * TOKEN_DELAY_S


def stream_counts(engines) -> list[float]:
    return [engine.requests_total().get("GenerateStream", 0) for engine in engines]


@pytest.mark.parametrize("rank", [0, 1])
def test_blocking_client_pins_its_rank(plain_gateway, synthetic_pair, rank):
    before = stream_counts(synthetic_pair)
    with DpgateClient(plain_gateway.address, rank=rank, timeout=10) as client:
        assert client.server_info().parallelism.data_parallel_rank == rank
        for _ in range(3):
            with client.stream("hello", FOUR_TOKENS) as stream:
                assert len(list(stream)) == 4
            assert stream.rank == rank
        assert client.generate("hello", FOUR_TOKENS).rank == rank
        # A call's own pin wins over the client's.
        assert client.generate("hello", FOUR_TOKENS, rank=1 - rank).rank == 1 - rank
        assert client.server_info(rank=1 - rank).parallelism.data_parallel_rank == 1 - rank
    after = stream_counts(synthetic_pair)
    assert after[rank] - before[rank] == 3
    assert after[1 - rank] == before[1 - rank]


@pytest.mark.parametrize("rank", [0, 1])
def test_async_client_pins_its_rank(plain_gateway, synthetic_pair, rank):
    async def run():
        async with AsyncDpgateClient(plain_gateway.address, rank=rank, timeout=10) as client:
            info = await client.server_info()
            streams = []
            for _ in range(3):
                stream = client.stream("hello", FOUR_TOKENS)
                assert len([delta async for delta in stream]) == 4
                streams.append(stream)
            answer = await client.generate("hello", FOUR_TOKENS)
            other = await client.generate("hello", FOUR_TOKENS, rank=1 - rank)
            return info, streams, answer, other

    before = stream_counts(synthetic_pair)
    info, streams, answer, other = asyncio.run(run())
    assert info.parallelism.data_parallel_rank == rank
    assert [stream.rank for stream in streams] == [rank] * 3
    assert (answer.rank, answer.text, other.rank) == (rank, "xxxx", 1 - rank)
    after = stream_counts(synthetic_pair)
    assert (after[rank] - before[rank], after[1 - rank] - before[1 - rank]) == (3, 0)


def test_a_rank_no_engine_owns_fails_with_the_gateways_message(plain_gateway):
    with DpgateClient(plain_gateway.address, rank=7, timeout=10) as client, pytest.raises(DpgateError) as info:
        list(client.stream("hello", FOUR_TOKENS))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.message == "data parallel rank 7 is not connected to this gateway; connected ranks: [0, 1]"
    assert str(info.value) == f"INVALID_ARGUMENT: {info.value.message}"


def test_blocking_deadlines(plain_gateway):
    with DpgateClient(plain_gateway.address, timeout=0.3) as client:
        started = time.monotonic()
        received = []
        with pytest.raises(DpgateError) as streamed:
            for delta in client.stream("hello", SLOW):
                received.append(delta)
        assert streamed.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert 0 < len(received) < 200  # the tokens before the deadline came through
        with pytest.raises(DpgateError) as unary:
            client.generate("hello", SLOW)
        assert unary.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 1.5
        # A call's own timeout wins over the client's default.
        assert client.generate("hello", GenerationOptions(max_tokens=40), timeout=5).text == "x" * 40


def test_async_deadlines(plain_gateway):
    async def run():
        async with AsyncDpgateClient(plain_gateway.address) as client:
            codes = []
            for call in (
                lambda: client.generate("hello", SLOW, 0.3),
                lambda: consume(client.stream("hello", SLOW, 0.3)),
            ):
                try:
                    await call()
                except DpgateError as error:
                    codes.append(error.code)
            return codes

    async def consume(stream):
        return [delta async for delta in stream]

    started = time.monotonic()
    assert asyncio.run(run()) == [grpc.StatusCode.DEADLINE_EXCEEDED] * 2
    assert time.monotonic() - started < 1.5


def test_api_key(key_gateway):
    with DpgateClient(key_gateway.address, api_key=API_KEY, timeout=10) as client:
        assert client.generate("hello", FOUR_TOKENS).text == "xxxx"
        assert len(list(client.stream("hello", FOUR_TOKENS))) == 4
    for key in (None, "wrong-key"):
        with DpgateClient(key_gateway.address, api_key=key, timeout=10) as client:
            with pytest.raises(DpgateError) as unary:
                client.generate("hello", FOUR_TOKENS)
            with pytest.raises(DpgateError) as streamed:
                list(client.stream("hello", FOUR_TOKENS))
        for error in (unary.value, streamed.value):
            assert (error.code, error.message) == (grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)


def test_async_api_key(key_gateway):
    async def run(key):
        async with AsyncDpgateClient(key_gateway.address, api_key=key, timeout=10) as client:
            try:
                return (await client.generate("hello", FOUR_TOKENS)).text
            except DpgateError as error:
                return error.code

    assert asyncio.run(run(API_KEY)) == "xxxx"
    assert asyncio.run(run(None)) == grpc.StatusCode.UNAUTHENTICATED


def test_tls(tls_gateway, pki):
    with DpgateClient(tls_gateway.address, tls=TlsOptions.from_files(ca=pki.ca.cert), timeout=10) as client:
        assert len(list(client.stream("hello", FOUR_TOKENS))) == 4

    async def run():
        async with AsyncDpgateClient(tls_gateway.address, tls=TlsOptions.from_files(ca=pki.ca.cert)) as client:
            return (await client.generate("hello", FOUR_TOKENS, 10)).text

    assert asyncio.run(run()) == "xxxx"
    with DpgateClient(tls_gateway.address, timeout=5) as plaintext, pytest.raises(DpgateError) as info:
        plaintext.generate("hello", FOUR_TOKENS)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_with_a_server_name_override(mtls_gateway, pki):
    full = TlsOptions.from_files(ca=pki.ca.cert, cert=pki.client.cert, key=pki.client.key, server_name=SERVER_NAME)
    with DpgateClient(mtls_gateway.address, tls=full, timeout=10) as client:
        with client.stream("hello", FOUR_TOKENS) as stream:
            assert len(list(stream)) == 4
        assert stream.finish.reason is FinishReason.LENGTH

    async def run():
        async with AsyncDpgateClient(mtls_gateway.address, tls=full, timeout=10) as client:
            return [delta.text async for delta in client.stream("hello", FOUR_TOKENS)]

    assert asyncio.run(run()) == ["x"] * 4
    refused = [
        # the certificate names SERVER_NAME, not 127.0.0.1
        TlsOptions.from_files(ca=pki.ca.cert, cert=pki.client.cert, key=pki.client.key),
        # mutual TLS: no client certificate, no call
        TlsOptions.from_files(ca=pki.ca.cert, server_name=SERVER_NAME),
    ]
    for tls in refused:
        with DpgateClient(mtls_gateway.address, tls=tls, timeout=5) as client, pytest.raises(DpgateError) as info:
            client.generate("hello", FOUR_TOKENS)
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
