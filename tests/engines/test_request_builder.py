"""Every rule a client can break is refused where the request enters, naming field and rule."""

from __future__ import annotations

import pytest

from dpgate.v1 import generate_pb2 as pb
from engines.request_builder import ModelLimits, UnknownModelError, UnsupportedFeatureError, build_sequence
from engines.sampling_params import InvalidRequestError

LIMITS = ModelLimits("smollm2-135m-instruct", vocab_size=49152, max_model_len=64, eos_token_ids=frozenset({2}))


def build(tokenizer, **fields):
    return build_sequence(pb.GenerateRequest(**fields), LIMITS, tokenizer)


def test_a_valid_request_becomes_a_sequence_with_defaults(smollm2_tokenizer):
    seq = build(smollm2_tokenizer, text="Hello there", request_id="abc")
    assert seq.request_id == "abc"
    assert seq.prompt_ids == smollm2_tokenizer("Hello there").input_ids
    assert seq.stopping.max_tokens == 16 and seq.sampling.temperature == 1.0
    assert seq.stop_token_ids == {2}


def test_the_default_max_tokens_shrinks_to_the_room_left(smollm2_tokenizer):
    seq = build(smollm2_tokenizer, token_ids=pb.TokenIds(ids=[5] * 60))
    assert seq.stopping.max_tokens == 4


def test_ignore_eos_keeps_only_user_stop_tokens(smollm2_tokenizer):
    stopping = pb.StoppingCriteria(ignore_eos=True, stop_token_ids=[7])
    assert build(smollm2_tokenizer, text="x", stopping=stopping).stop_token_ids == {7}


def test_a_request_without_an_id_gets_a_unique_one(smollm2_tokenizer):
    assert build(smollm2_tokenizer, text="x").request_id != build(smollm2_tokenizer, text="x").request_id


BAD_REQUESTS = [
    ({}, "prompt must be set: give text or token_ids"),
    ({"text": ""}, "prompt text must not be empty"),
    ({"token_ids": pb.TokenIds()}, "prompt token_ids must not be empty"),
    ({"token_ids": pb.TokenIds(ids=[1, 49152])}, "prompt token_ids 49152 must be < vocab size 49152"),
    (
        {"token_ids": pb.TokenIds(ids=[5] * 64)},
        "prompt has 64 tokens but must be shorter than the model's context of 64 tokens",
    ),
    ({"text": "x", "stopping": pb.StoppingCriteria(max_tokens=0)}, "stopping.max_tokens must be >= 1"),
    ({"text": "x", "stopping": pb.StoppingCriteria(max_tokens=-5)}, "stopping.max_tokens must be >= 1"),
    (
        {"text": "x", "stopping": pb.StoppingCriteria(max_tokens=64)},
        "stopping.max_tokens (64) must be <= 63: the prompt has 1 tokens and the model's context is 64",
    ),
    ({"text": "x", "stopping": pb.StoppingCriteria(min_tokens=-1)}, "stopping.min_tokens must be >= 0"),
    ({"text": "x", "stopping": pb.StoppingCriteria(stop=[""])}, "stopping.stop strings must not be empty"),
    (
        {"text": "x", "stopping": pb.StoppingCriteria(stop_token_ids=[60000])},
        "stopping.stop_token_ids 60000 must be < vocab size 49152",
    ),
    ({"text": "x", "sampling": pb.SamplingParams(temperature=-1)}, "sampling.temperature must be >= 0"),
    ({"text": "x", "sampling": pb.SamplingParams(top_p=0)}, "sampling.top_p must be in (0, 1]"),
    ({"text": "x", "sampling": pb.SamplingParams(top_p=1.01)}, "sampling.top_p must be in (0, 1]"),
    ({"text": "x", "sampling": pb.SamplingParams(top_k=-1)}, "sampling.top_k must be >= 0 (0 disables it)"),
    ({"text": "x", "logprobs": pb.LogprobsOptions(top_n=50)}, "logprobs.top_n must be in [0, 20]"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_REQUESTS)
def test_bad_requests_are_refused_with_the_field_and_rule(smollm2_tokenizer, fields, message):
    with pytest.raises(InvalidRequestError) as error:
        build(smollm2_tokenizer, **fields)
    assert str(error.value) == message


def test_an_unknown_model_is_not_found(smollm2_tokenizer):
    with pytest.raises(UnknownModelError, match="model 'gpt-9' is not served here"):
        build(smollm2_tokenizer, text="x", model="gpt-9")


def test_structured_output_is_refused_until_the_grammar_engine_lands(smollm2_tokenizer):
    with pytest.raises(UnsupportedFeatureError, match="structured_output"):
        build(smollm2_tokenizer, text="x", structured_output=pb.StructuredOutput(regex="a+"))
