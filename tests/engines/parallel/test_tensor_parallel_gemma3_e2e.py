"""Gemma 3 270M (four query heads, one KV head) on two ranks with decode context parallelism:
without DCP both ranks would hold the whole KV cache; with it each holds half the tokens. In
float32 without quantization its greedy tokens equal the single-process engine's and its
logprobs agree within 1e-4, on a short prompt and on one of more than 2,000 tokens (which also
crosses the 512-token sliding window of the local layers)."""

from __future__ import annotations

import grpc

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from tests.engines.parallel.test_tensor_parallel_e2e import assert_close
from tests.support.processes import free_port, running

COLORS = ["red", "green", "blue", "yellow", "white", "black", "grey"]
ANIMALS = ["fox", "heron", "otter", "badger", "lynx", "crow", "hare", "stag", "wolf", "owl", "seal"]
LONG_PROMPT = " ".join(
    f"Entry {i}: the {COLORS[i % 7]} {ANIMALS[i % 11]} crossed river {i * 7 % 13} at dawn." for i in range(150)
)
PROMPTS = ["The capital of France is", LONG_PROMPT]
FLAGS = ["--model", "gemma3-270m", "--dtype", "float32", "--quantization", "none", "--max-model-len", "4096"]


def generate_all(flags, log_path, base=FLAGS):
    port = free_port()
    engine = running(["engine", "--port", str(port), *base, *flags], port, timeout=300, log_path=str(log_path))
    with engine as e, grpc.insecure_channel(e.address) as channel:
        info = control_pb2_grpc.ControlServiceStub(channel).GetServerInfo(cpb.GetServerInfoRequest())
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        replies = [
            stub.Generate(
                pb.GenerateRequest(
                    text=prompt,
                    sampling=pb.SamplingParams(temperature=0.0),
                    stopping=pb.StoppingCriteria(max_tokens=8, ignore_eos=True),
                    logprobs=pb.LogprobsOptions(top_n=3),
                ),
                timeout=300,
            )
            for prompt in PROMPTS
        ]
    return info, replies


def test_gemma3_on_tp2_dcp2_matches_one_process_past_2000_tokens(tmp_path):
    single_info, single = generate_all([], tmp_path / "single.log")
    info, parallel = generate_all(
        ["--tensor-parallel-size", "2", "--decode-context-parallel-size", "2"], tmp_path / "parallel.log"
    )
    assert single[1].finish.num_prompt_tokens > 2000
    assert info.kv_capacity_tokens == 2 * single_info.kv_capacity_tokens
    for expected, actual in zip(single, parallel, strict=True):
        assert_close(expected, actual, 1e-4)


def test_gemma3_on_tp2_gives_one_process_bits_with_the_served_default(tmp_path):
    """The served default for a GGUF is int-dot over its own blocks, and each rank takes its rows
    of them (engines/parallel/sharding.py, shard_blocks): every output is one row's integer sums
    through one float32 chain on one rank, so T = 2 gives T = 1's tokens and logprobs exactly."""
    default = ["--model", "gemma3-270m", "--max-model-len", "4096"]
    _, single = generate_all([], tmp_path / "single.log", base=default)
    _, parallel = generate_all(["--tensor-parallel-size", "2"], tmp_path / "parallel.log", base=default)
    for log in ("single.log", "parallel.log"):
        assert "int-dot weights" in (tmp_path / log).read_text()
    for expected, actual in zip(single, parallel, strict=True):
        assert_close(expected, actual, 0.0)
