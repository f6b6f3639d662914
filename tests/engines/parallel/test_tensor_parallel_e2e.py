"""Tensor-parallel engines with decode context parallelism, run as a user runs them: `dpgate engine
--tensor-parallel-size T --decode-context-parallel-size C` over real gRPC, on a tiny model with one
KV head (so DCP is what keeps its KV cache from being replicated).

In float32 without quantization every (T, C) gives the single-process engine's greedy tokens and
logprobs within 1e-4 (with C = 1, its very bits: each output of a layer is one sum on one rank),
holds C times its KV capacity in the same memory per rank, and stays batch invariant: a request's
tokens and logprobs are the same alone and beside others. T = 2 also gives T = 1's bits with the
served default numerics (int8 weights on the batch-invariant kernels).
"""

from __future__ import annotations

import random
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from tests.support.processes import free_port, running
from tests.tiny_model import make_tiny_llama_dir

EXACT = ["--dtype", "float32", "--quantization", "none"]
NUM_TOKENS = 12


@pytest.fixture(scope="module")
def one_kv_head_model(tmp_path_factory):
    return make_tiny_llama_dir(tmp_path_factory.mktemp("tiny-one-kv-head"), seed=3, num_key_value_heads=1)


def prompts() -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(100, 40000) for _ in range(length)] for length in (3, 17, 40, 150)]


def request(prompt: list[int]) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=prompt),
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_tokens=NUM_TOKENS, ignore_eos=True),
        logprobs=pb.LogprobsOptions(top_n=5),
        prompt_logprobs=pb.PromptLogprobsOptions(top_n=3),
    )


def serve_and_collect(model, flags, log_path):
    """Server info, then each prompt alone, then all prompts at once."""
    port = free_port()
    args = ["engine", "--port", str(port), "--model", str(model), *flags]
    engine_process = running(args, port, timeout=180, log_path=str(log_path))
    with engine_process as engine, grpc.insecure_channel(engine.address) as ch:
        info = control_pb2_grpc.ControlServiceStub(ch).GetServerInfo(cpb.GetServerInfoRequest())
        stub = generate_pb2_grpc.InferenceServiceStub(ch)
        alone = [stub.Generate(request(p), timeout=120) for p in prompts()]
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda p: stub.Generate(request(p), timeout=120), prompts()))
    return info, alone, together


@pytest.fixture(scope="module")
def single_process(one_kv_head_model, tmp_path_factory):
    return serve_and_collect(one_kv_head_model, EXACT, tmp_path_factory.mktemp("tp") / "t1.log")


def assert_close(expected: pb.GenerateResponse, actual: pb.GenerateResponse, tolerance: float) -> None:
    assert list(actual.token_ids) == list(expected.token_ids)
    for want, got in zip([*expected.logprobs, *expected.prompt_logprobs], [*actual.logprobs, *actual.prompt_logprobs],
                         strict=True):  # fmt: skip
        assert got.token_id == want.token_id
        assert abs(want.logprob - got.logprob) <= tolerance
        assert [t.token_id for t in got.top_logprobs] == [t.token_id for t in want.top_logprobs]
        pairs = zip(want.top_logprobs, got.top_logprobs, strict=True)
        assert all(abs(a.logprob - b.logprob) <= tolerance for a, b in pairs)


@pytest.mark.parametrize(("tp", "dcp"), [(2, 1), (2, 2), (4, 4)])
def test_tensor_and_context_parallel_engines_match_one_process(one_kv_head_model, single_process, tmp_path, tp, dcp):
    flags = [*EXACT, "--tensor-parallel-size", str(tp), "--decode-context-parallel-size", str(dcp)]
    if tp > 2:
        flags.append("--allow-oversubscribe")  # four processes on a 2-core CI machine
    info, alone, together = serve_and_collect(one_kv_head_model, flags, tmp_path / "engine.log")
    parallelism = info.parallelism
    assert (parallelism.tensor_parallel_size, parallelism.decode_context_parallel_size) == (tp, dcp)
    assert parallelism.dcp_kv_interleave == 1
    # One KV head: with C = 1 every rank holds it all; DCP splits its tokens, so the same memory
    # per rank holds C times the context.
    base = single_process[0]
    assert info.num_kv_blocks == base.num_kv_blocks
    assert info.kv_capacity_tokens == dcp * base.kv_capacity_tokens == info.num_kv_blocks * info.kv_block_size
    for expected, actual, prompt in zip(single_process[1], alone, prompts(), strict=True):
        assert [t.token_id for t in expected.prompt_logprobs] == prompt[1:]
        # DCP combines partial softmaxes (rounded unlike one pass); TP alone splits no sum.
        assert_close(expected, actual, 1e-4 if dcp > 1 else 0.0)
    for by_itself, in_a_batch in zip(alone, together, strict=True):  # batch invariance for this (T, C)
        assert list(in_a_batch.token_ids) == list(by_itself.token_ids)
        assert list(in_a_batch.logprobs) == list(by_itself.logprobs)
        assert list(in_a_batch.prompt_logprobs) == list(by_itself.prompt_logprobs)


def test_an_interleave_of_four_matches_too(one_kv_head_model, single_process, tmp_path):
    flags = [*EXACT, "--tensor-parallel-size", "2", "--decode-context-parallel-size", "2", "--dcp-kv-interleave", "4"]
    info, alone, _ = serve_and_collect(one_kv_head_model, flags, tmp_path / "engine.log")
    assert info.parallelism.dcp_kv_interleave == 4
    for expected, actual in zip(single_process[1], alone, strict=True):
        assert_close(expected, actual, 1e-4)


def test_the_served_default_with_tp2_dcp2_serves_a_batch_through_the_gateway(one_kv_head_model, tmp_path):
    """`dpgate serve` with one TP-2/DCP-2 engine in the served default (float32 + int8 on the
    batch-invariant kernels): a batch of calls through the gateway completes, each call's tokens
    and logprobs the same as when it ran alone."""
    from tests.support.gateway_processes import PYTHON, ROOT
    from tests.support.health import poll_until_serving

    port = free_port()
    command = [PYTHON, "-m", "dpgate.cli", "serve", "--port", str(port), "--http-port", "0",
               "--model", str(one_kv_head_model), "--tensor-parallel-size", "2",
               "--decode-context-parallel-size", "2"]  # fmt: skip
    with open(tmp_path / "serve.log", "w") as log:
        serve = subprocess.Popen(command, stdout=log, stderr=log, cwd=ROOT)
        try:
            poll_until_serving(f"127.0.0.1:{port}", timeout=180, process=serve, interval=0.1)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = generate_pb2_grpc.InferenceServiceStub(channel)
                batch = prompts() + [p[::-1] for p in prompts()]
                alone = [stub.Generate(request(p), timeout=60) for p in batch]
                with ThreadPoolExecutor(len(batch)) as pool:
                    together = list(pool.map(lambda p: stub.Generate(request(p), timeout=60), batch))
            for by_itself, in_a_batch in zip(alone, together, strict=True):
                assert len(in_a_batch.token_ids) == NUM_TOKENS
                assert list(in_a_batch.token_ids) == list(by_itself.token_ids)
                assert list(in_a_batch.logprobs) == list(by_itself.logprobs)
        finally:
            serve.send_signal(signal.SIGTERM)
            try:
                assert serve.wait(60) == 0
            finally:
                if serve.poll() is None:
                    serve.kill()


def test_two_tensor_parallel_ranks_give_one_process_bits_with_the_served_default(one_kv_head_model, tmp_path):
    _, expected, _ = serve_and_collect(one_kv_head_model, [], tmp_path / "t1.log")
    _, actual, together = serve_and_collect(one_kv_head_model, ["--tensor-parallel-size", "2"], tmp_path / "t2.log")
    for want, got, in_a_batch in zip(expected, actual, together, strict=True):
        assert_close(want, got, 0.0)
        assert_close(want, in_a_batch, 0.0)
