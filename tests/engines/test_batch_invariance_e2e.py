"""Batch invariance as a client sees it: `dpgate engine` in its served default, over real gRPC.

Eight greedy prompts are run alone, then again while eight sampled noise streams run and are
cancelled at random points and a 1,500-token prompt is prefilled in chunks beside them: every
token id and every logprob (with its alternatives) is the same. A second engine with a tiny KV
cache does the same under preemption by recompute.
"""

from __future__ import annotations

import random
import re
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from tests.support.processes import free_port, running

PROMPTS = [
    "The history of the printing press begins",
    "def quicksort(items):",
    "Photosynthesis is the process by which",
    "<|im_start|>user\nName three rivers in Europe.<|im_end|>\n<|im_start|>assistant\n",
    "In the year 1905, Albert Einstein",
    "The recipe calls for two cups of flour and",
    "Once upon a time, a lighthouse keeper",
    "Le chat est assis sur",
]
NUM_TOKENS = 40


def greedy_request(prompt: str) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        text=prompt,
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_tokens=NUM_TOKENS, ignore_eos=True),
        logprobs=pb.LogprobsOptions(top_n=3),
    )


def noise_request(seed: int, max_tokens: int) -> pb.GenerateStreamRequest:
    return pb.GenerateStreamRequest(
        text=f"Noise stream {seed}: write whatever comes to mind about",
        sampling=pb.SamplingParams(temperature=0.9, top_p=0.95, seed=seed),
        stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
    )


def run_noise(inference, seed: int, max_tokens: int, cancel_after: int, started: threading.Event) -> int:
    """Stream a sampled request and cancel it after `cancel_after` messages; returns messages read."""
    call = inference.GenerateStream(noise_request(seed, max_tokens), timeout=120)
    read = 0
    try:
        for _ in call:
            read += 1
            started.set()
            if read >= cancel_after:
                call.cancel()
                break
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.CANCELLED, error
    return read


def outputs_alone_then_busy(address: str, long_prompt: list[int] | None, noise_tokens: int):
    rng = random.Random(7)
    with grpc.insecure_channel(address) as channel:
        inference = generate_pb2_grpc.InferenceServiceStub(channel)
        alone = [inference.Generate(greedy_request(p), timeout=120) for p in PROMPTS]
        with ThreadPoolExecutor(8 + 1 + len(PROMPTS)) as pool:
            first_noise = threading.Event()
            noise = [
                pool.submit(run_noise, inference, 100 + i, noise_tokens, rng.randrange(2, noise_tokens), first_noise)
                for i in range(8)
            ]
            assert first_noise.wait(60), "no noise stream started"
            long = None
            if long_prompt is not None:
                request = pb.GenerateRequest(
                    token_ids=pb.TokenIds(ids=long_prompt), stopping=pb.StoppingCriteria(max_tokens=4, ignore_eos=True)
                )
                long = pool.submit(inference.Generate, request, timeout=120)
            busy = [pool.submit(inference.Generate, greedy_request(p), timeout=120) for p in PROMPTS]
            busy = [future.result() for future in busy]
            assert all(future.result() >= 1 for future in noise)
            if long is not None:
                assert len(long.result().token_ids) == 4
    return alone, busy


def assert_identical(alone: list[pb.GenerateResponse], busy: list[pb.GenerateResponse]) -> None:
    for prompt, expected, actual in zip(PROMPTS, alone, busy, strict=True):
        assert len(expected.token_ids) == NUM_TOKENS
        assert list(actual.token_ids) == list(expected.token_ids), prompt
        assert list(actual.logprobs) == list(expected.logprobs), prompt  # logprob and top-3, bit for bit


def engine_args(port: int, metrics_port: int, *extra: str) -> list[str]:
    return ["engine", "--port", str(port), "--metrics-port", str(metrics_port), *extra]


def check_served_default(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        info = control_pb2_grpc.ControlServiceStub(channel).GetModelInfo(cpb.GetModelInfoRequest())
    assert info.batch_invariant and (info.dtype, info.quantization) == ("float32", "int-dot")
    print(f"\nkernels: {info.kernels} on {info.cpu}")


def counter(metrics_port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return float(re.search(rf"^{name} (\S+)$", body, re.MULTILINE).group(1))


def test_greedy_outputs_are_identical_beside_noise_streams_and_a_long_chunked_prefill(tmp_path):
    port, metrics_port = free_port(), free_port()
    with running(engine_args(port, metrics_port), port, log_path=str(tmp_path / "engine.log")) as engine:
        check_served_default(engine.address)
        long_prompt = [random.Random(3).randrange(100, 40000) for _ in range(1500)]
        alone, busy = outputs_alone_then_busy(engine.address, long_prompt, noise_tokens=60)
        assert counter(metrics_port, "dpgate_engine_prompt_tokens_total") > 1500
    assert_identical(alone, busy)


@pytest.mark.parametrize("num_kv_blocks", [24])
def test_greedy_outputs_are_identical_under_preemption_by_recompute(tmp_path, num_kv_blocks):
    """24 blocks of 16 tokens hold 384 tokens: eight prompts of about 60 tokens plus eight noise
    streams cannot all fit, so the newest running sequences are preempted and recomputed."""
    port, metrics_port = free_port(), free_port()
    args = engine_args(port, metrics_port, "--num-kv-blocks", str(num_kv_blocks), "--max-num-seqs", "16")
    with running(args, port, log_path=str(tmp_path / "engine.log")) as engine:
        check_served_default(engine.address)
        alone, busy = outputs_alone_then_busy(engine.address, None, noise_tokens=120)
        assert counter(metrics_port, "dpgate_engine_preemptions_total") > 0
    assert_identical(alone, busy)
