"""Structured output on a tensor-parallel engine with decode context parallelism (`dpgate engine
--tensor-parallel-size 2 --decode-context-parallel-size 2`): sampling, and so masking, happens on
rank 0, so the outputs are the single-process engine's tokens, and they follow their grammar.

The model is tiny and random: left free it emits noise, so valid output is the grammar's doing.
Its generation_config.json lists eos ids [2, 0]: token 0 (<|endoftext|>), pushed up by +100,
waits for the grammar to end like the tokenizer's own eos."""

from __future__ import annotations

import json
import re

import grpc
import jsonschema
import pytest

from dpgate.v1 import generate_pb2 as pb
from dpgate.v1 import generate_pb2_grpc
from tests.support.processes import free_port, running
from tests.tiny_model import make_tiny_llama_dir

EXACT = ["--dtype", "float32", "--quantization", "none"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "n"],
}
REGEX = r"[a-z]{2,5}-[0-9]{2}"


@pytest.fixture(scope="module")
def one_kv_head_model(tmp_path_factory):
    return make_tiny_llama_dir(tmp_path_factory.mktemp("tiny-grammar"), seed=3, num_key_value_heads=1)


def requests() -> list[pb.GenerateRequest]:
    def request(structured_output, bias=None):
        return pb.GenerateRequest(
            text="Hello",
            sampling=pb.SamplingParams(temperature=0.0, logit_bias=bias or {}),
            stopping=pb.StoppingCriteria(max_tokens=40),
            structured_output=structured_output,
            logprobs=pb.LogprobsOptions(top_n=1),
        )

    return [
        request(pb.StructuredOutput(json_schema=json.dumps(SCHEMA))),
        request(pb.StructuredOutput(json_schema=json.dumps(SCHEMA)), {0: 100.0}),
        request(pb.StructuredOutput(regex=REGEX)),
        request(pb.StructuredOutput(choice=pb.ChoiceList(choices=["alpha", "beta"]))),
    ]


def serve_and_generate(model, flags, log_path) -> list[pb.GenerateResponse]:
    port = free_port()
    args = ["engine", "--port", str(port), "--model", str(model), *EXACT, *flags]
    with (
        running(args, port, timeout=180, log_path=str(log_path)) as engine,
        grpc.insecure_channel(engine.address) as ch,
    ):
        stub = generate_pb2_grpc.InferenceServiceStub(ch)
        return [stub.Generate(r, timeout=120) for r in requests()]


def test_a_tensor_and_context_parallel_engine_masks_on_rank_0_like_one_process(one_kv_head_model, tmp_path):
    single = serve_and_generate(one_kv_head_model, [], tmp_path / "t1.log")
    parallel = serve_and_generate(
        one_kv_head_model, ["--tensor-parallel-size", "2", "--decode-context-parallel-size", "2"], tmp_path / "t2.log"
    )
    assert [list(r.token_ids) for r in parallel] == [list(r.token_ids) for r in single]
    for response in parallel:
        assert response.finish.reason == pb.FINISH_REASON_STOP
    plain, biased, regex, choice = parallel
    jsonschema.validate(json.loads(plain.text), SCHEMA)
    jsonschema.validate(json.loads(biased.text), SCHEMA)
    assert biased.finish.stop_token_id == 0 and 0 not in list(biased.token_ids)[:-1]
    assert re.fullmatch(REGEX, regex.text) and choice.text in ("alpha", "beta")
