"""The client's argument checks and result types, without a server (milliseconds)."""

from __future__ import annotations

import re

import grpc
import pytest

from dpgate.client import AsyncDpgateClient, DpgateClient, FinishReason, GenerationOptions, TlsOptions
from dpgate.client.options import call_metadata, serving_rank
from dpgate.client.results import DpgateError, Finish, StreamState
from dpgate.v1 import generate_pb2


@pytest.mark.parametrize("rank", [-1, 2**32, True, "1", 1.0])
def test_a_rank_outside_unsigned_32_bits_is_refused(rank):
    with pytest.raises(ValueError, match=r"^rank must be an integer in 0\.\.4294967295"):
        DpgateClient("127.0.0.1:1", rank=rank)


def test_a_call_checks_its_own_rank_and_timeout():
    with DpgateClient("127.0.0.1:1") as client:
        with pytest.raises(ValueError, match=r"^rank must be"):
            client.stream("hi", rank=-2)
        with pytest.raises(ValueError, match=r"^timeout must be above 0 seconds"):
            client.generate("hi", timeout=0)


@pytest.mark.parametrize("timeout", [0, -1.5, float("nan"), float("inf"), "5"])
def test_a_timeout_must_be_finite_and_positive(timeout):
    with pytest.raises(ValueError, match=r"^timeout must be"):
        DpgateClient("127.0.0.1:1", timeout=timeout)


@pytest.mark.parametrize("key", ["", "has space", "caf\u00e9", "tab\tkey"])
def test_an_api_key_must_be_what_the_gateway_accepts(key):
    with pytest.raises(ValueError, match=r"^api_key must be non-empty printable ASCII without spaces$"):
        DpgateClient("127.0.0.1:1", api_key=key)


def test_the_metadata_carries_the_pin_and_the_bearer_key():
    assert call_metadata(None, None) == ()
    assert call_metadata(3, "k") == (("x-data-parallel-rank", "3"), ("authorization", "Bearer k"))
    assert DpgateClient("127.0.0.1:1", rank=0, api_key="k").metadata == call_metadata(0, "k")


def test_the_serving_rank_comes_from_the_trailer():
    assert serving_rank((("x-data-parallel-rank", "1"),)) == 1
    assert serving_rank((("other", "1"),)) is None
    assert serving_rank(None) is None


def test_tls_options_are_checked_where_they_enter(tmp_path):
    with pytest.raises(ValueError, match="client certificate and its private key must be given together"):
        TlsOptions(certificate_chain=b"pem")
    with pytest.raises(ValueError, match=r"^server_name must be"):
        TlsOptions(server_name="")
    missing = tmp_path / "missing.pem"
    with pytest.raises(ValueError, match="^" + re.escape(f"ca {str(missing)!r} is not a readable file")):
        TlsOptions.from_files(ca=missing)
    with pytest.raises(ValueError, match=r"^give tls or credentials, not both$"):
        DpgateClient("127.0.0.1:1", tls=TlsOptions(), credentials=grpc.ssl_channel_credentials())
    assert TlsOptions(server_name="a.test").channel_options() == (("grpc.ssl_target_name_override", "a.test"),)


def test_an_empty_address_is_refused():
    with pytest.raises(ValueError, match=r"^address must be"):
        AsyncDpgateClient(" ")


def test_generation_options_fill_only_what_is_set():
    request = GenerationOptions(max_tokens=3, temperature=0.0, stop=["."]).stream_request("p")
    assert request.text == "p"
    assert request.stopping.max_tokens == 3 and list(request.stopping.stop) == ["."]
    assert request.sampling.HasField("temperature") and not request.sampling.HasField("seed")
    assert not GenerationOptions().generate_request("p").stopping.HasField("max_tokens")


def test_the_stream_state_folds_prompt_deltas_and_finish():
    state = StreamState()
    message = generate_pb2.GenerateStreamResponse
    assert state.take(message(prompt_info=generate_pb2.PromptInfo(request_id="a", prompt_token_ids=[1, 2]))) is None
    delta = state.take(message(delta=generate_pb2.Delta(text="hi", token_ids=[5])))
    assert (delta.text, delta.token_ids) == ("hi", (5,))
    with pytest.raises(DpgateError, match=r"^INTERNAL: the stream ended without finish info$"):
        state.check_finished()
    finish = generate_pb2.FinishInfo(
        reason=generate_pb2.FINISH_REASON_STOP, stop_string="\n", num_prompt_tokens=2, num_generated_tokens=1
    )
    assert state.take(message(finish=finish)) is None
    state.check_finished()
    assert (state.request_id, state.prompt_token_ids) == ("a", (1, 2))
    assert state.finish == Finish.from_message(finish)
    assert (state.finish.reason, state.finish.matched_stop) == (FinishReason.STOP, "\n")
    assert state.finish.usage.prompt_tokens == 2
