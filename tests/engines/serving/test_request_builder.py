"""Every rule a client can break is refused where the request enters, naming field and rule."""

from __future__ import annotations

import pytest

from dpgate.v1 import generate_pb2 as pb
from engines.grammar.spec import GrammarKind, GrammarSpec
from engines.sampling.params import InvalidRequestError
from engines.serving.request_builder import ModelLimits, UnknownModelError, build_sequence

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
    (
        {"text": "x", "sampling": pb.SamplingParams(temperature=-1)},
        "sampling.temperature must be 0 (greedy) or in [0.001, 100]",
    ),
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


STRUCTURED_OUTPUTS = [
    (pb.StructuredOutput(json_schema='{"type": "string"}'), GrammarSpec(GrammarKind.JSON_SCHEMA, '{"type": "string"}')),
    (pb.StructuredOutput(json_object=pb.JsonObject()), GrammarSpec(GrammarKind.JSON_OBJECT, "")),
    (pb.StructuredOutput(regex="a+"), GrammarSpec(GrammarKind.REGEX, "a+")),
    (pb.StructuredOutput(ebnf='root ::= "x"'), GrammarSpec(GrammarKind.EBNF, 'root ::= "x"')),
    (
        pb.StructuredOutput(choice=pb.ChoiceList(choices=["a", "b"])),
        GrammarSpec(GrammarKind.CHOICE, 'root ::= "a" | "b"'),
    ),
]


@pytest.mark.parametrize(("wire", "spec"), STRUCTURED_OUTPUTS)
def test_each_structured_output_kind_becomes_a_grammar_spec(smollm2_tokenizer, wire, spec):
    assert build(smollm2_tokenizer, text="x", structured_output=wire).grammar_spec == spec


def test_a_request_without_structured_output_has_no_grammar(smollm2_tokenizer):
    assert build(smollm2_tokenizer, text="x").grammar_spec is None


BAD_STRUCTURED_OUTPUTS = [
    (pb.StructuredOutput(), "structured_output must set one kind"),
    (pb.StructuredOutput(json_schema="{not json"), "structured_output.json_schema is not valid JSON: Expecting"),
    (pb.StructuredOutput(json_schema="[1, 2]"), "structured_output.json_schema must be a JSON object"),
    (
        pb.StructuredOutput(json_schema=" " * 40000 + "{}"),
        "structured_output.json_schema is 40002 bytes; at most 32768",
    ),
    (pb.StructuredOutput(regex=""), "structured_output.regex must not be empty"),
    (pb.StructuredOutput(ebnf="  "), "structured_output.ebnf must not be empty"),
    (pb.StructuredOutput(choice=pb.ChoiceList()), "structured_output.choice.choices must hold at least one string"),
]


@pytest.mark.parametrize(("wire", "message"), BAD_STRUCTURED_OUTPUTS)
def test_bad_structured_outputs_are_refused_naming_the_field(smollm2_tokenizer, wire, message):
    with pytest.raises(InvalidRequestError) as error:
        build(smollm2_tokenizer, text="x", structured_output=wire)
    assert str(error.value).startswith(message)


def test_a_grammar_needs_a_stop_token_to_end(smollm2_tokenizer):
    wire = pb.StructuredOutput(regex="a+")
    with pytest.raises(InvalidRequestError, match="structured_output needs a token that ends the output"):
        build(smollm2_tokenizer, text="x", structured_output=wire, stopping=pb.StoppingCriteria(ignore_eos=True))
    seq = build(
        smollm2_tokenizer,
        text="x",
        structured_output=wire,
        stopping=pb.StoppingCriteria(ignore_eos=True, stop_token_ids=[7]),
    )
    assert seq.stop_token_ids == {7}
