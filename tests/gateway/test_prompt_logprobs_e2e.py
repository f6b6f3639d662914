"""prompt_logprobs through the gateway: relayed unchanged both ways, as the engine answers it."""

from __future__ import annotations

import grpc
import pytest

from dpgate.v1 import generate_pb2 as pb
from tests.support.gateway_processes import RANK_KEY, inference_stub

PROMPT = [1, 504, 3458, 314, 260, 2463, 282, 3000, 1045, 28, 7777, 19]


def scoring_request(message_type, top_n: int = 2):
    return message_type(
        token_ids=pb.TokenIds(ids=PROMPT),
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_tokens=2, ignore_eos=True),
        prompt_logprobs=pb.PromptLogprobsOptions(top_n=top_n),
    )


def test_prompt_logprobs_through_the_gateway_equal_the_engines_own(gateway, engines):
    pinned = [(RANK_KEY, "0")]
    with grpc.insecure_channel(gateway.address) as via, grpc.insecure_channel(engines[0].address) as direct:
        relayed = inference_stub(via).Generate(scoring_request(pb.GenerateRequest), metadata=pinned, timeout=30)
        own = inference_stub(direct).Generate(scoring_request(pb.GenerateRequest), timeout=30)
        stream = list(inference_stub(via).GenerateStream(scoring_request(pb.GenerateStreamRequest), timeout=30))
    assert [t.token_id for t in own.prompt_logprobs] == PROMPT[1:]
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0.0 for t in own.prompt_logprobs)
    assert list(relayed.prompt_logprobs) == list(own.prompt_logprobs)  # bit for bit
    assert stream[0].WhichOneof("event") == "prompt_info"  # the first message carries them
    assert list(stream[0].prompt_info.prompt_logprobs) == list(own.prompt_logprobs)
    assert all(not m.delta.logprobs for m in stream if m.WhichOneof("event") == "delta")  # none asked for


def test_a_bad_prompt_logprobs_top_n_is_invalid_argument_naming_the_field(gateway):
    with grpc.insecure_channel(gateway.address) as channel, pytest.raises(grpc.RpcError) as refused:
        inference_stub(channel).Generate(scoring_request(pb.GenerateRequest, top_n=21), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "prompt_logprobs.top_n must be in [0, 20]"
