"""Structured output end to end, as a user runs it: `dpgate serve` (a gateway in front of one
SmolLM2 engine) over real gRPC. The gateway relays bodies unparsed, so the engine, where sampling
happens, is where masks apply; every status comes back through the gateway."""

from __future__ import annotations

import json

import grpc
import jsonschema
import pytest

from dpgate.v1 import generate_pb2 as pb
from dpgate.v1 import generate_pb2_grpc
from tests.support.processes import free_port, running

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999999},
    },
    "required": ["city", "population"],
}


@pytest.fixture(scope="module")
def inference(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with (
        running(
            ["serve", "--port", str(port), "--http-port", "0", "--max-model-len", "2048"],
            port,
            timeout=240,
            log_path=str(log),
        ),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield generate_pb2_grpc.InferenceServiceStub(channel)


def generate(prompt: str, structured_output: pb.StructuredOutput, **stopping) -> pb.GenerateRequest:
    sampling = pb.SamplingParams(temperature=0.0, logit_bias=stopping.pop("logit_bias", {}))
    return pb.GenerateRequest(
        text=CHAT.format(prompt),
        sampling=sampling,
        stopping=pb.StoppingCriteria(max_tokens=64, **stopping),
        structured_output=structured_output,
    )


def as_stream(request: pb.GenerateRequest) -> pb.GenerateStreamRequest:
    return pb.GenerateStreamRequest.FromString(request.SerializeToString())


def test_a_json_schema_through_the_gateway_gives_valid_json(inference):
    request = generate("The largest city of France, as JSON.", pb.StructuredOutput(json_schema=json.dumps(SCHEMA)))
    response = inference.Generate(request, timeout=120)
    jsonschema.validate(json.loads(response.text), SCHEMA)
    assert response.finish.reason == pb.FINISH_REASON_STOP and response.finish.stop_token_id == 2


def test_a_choice_and_a_json_object_through_the_gateway(inference):
    choice = pb.StructuredOutput(choice=pb.ChoiceList(choices=["yes", "no"]))
    assert inference.Generate(generate("Is Paris in France?", choice), timeout=120).text in ("yes", "no")
    any_object = pb.StructuredOutput(json_object=pb.JsonObject())
    assert isinstance(json.loads(inference.Generate(generate("A JSON object.", any_object), timeout=120).text), dict)


def test_a_grammar_that_does_not_compile_is_invalid_argument_before_any_message(inference):
    stream = inference.GenerateStream(as_stream(generate("x", pb.StructuredOutput(regex="a(b"))), timeout=60)
    received = []
    with pytest.raises(grpc.RpcError) as error:
        for message in stream:
            received.append(message)
    assert received == []
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("structured_output.regex does not compile: Regex parsing error")


def test_a_schema_that_is_not_json_is_invalid_argument(inference):
    with pytest.raises(grpc.RpcError) as error:
        inference.Generate(generate("x", pb.StructuredOutput(json_schema="{'type': 'string'}")), timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("structured_output.json_schema is not valid JSON")


def test_a_stop_token_the_grammar_needs_next_ends_the_stream_with_the_conflict(inference):
    # In SmolLM2's vocabulary "a" is 81 and "b" is 82; regex "ab" needs "b", a stop token here.
    request = generate("Say ab.", pb.StructuredOutput(regex="ab"), stop_token_ids=[82], logit_bias={81: 100.0})
    received = []
    with pytest.raises(grpc.RpcError) as error:
        for message in inference.GenerateStream(as_stream(request), timeout=60):
            received.append(message)
    assert [m.WhichOneof("event") for m in received] == ["prompt_info", "delta"]
    assert list(received[1].delta.token_ids) == [81]
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the grammar can only continue with token(s) [82], which are stop tokens of this request" in (
        error.value.details()
    )
