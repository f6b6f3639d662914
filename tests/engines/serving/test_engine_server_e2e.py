"""`dpgate engine` as a user runs it: a subprocess serving the default model, driven over real
gRPC on a socket."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from engines.runner.thread_choice import candidates
from tests.support.processes import free_port, running

MODEL = "smollm2-135m-instruct"
GREEDY = pb.SamplingParams(temperature=0.0)
CHAT_PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with running(["engine", "--port", str(port), "--metrics-port", str(free_port())], port, log_path=str(log)) as proc:
        print(f"\nengine reported SERVING {proc.seconds_to_serving:.1f} s after launch")
        yield proc


@pytest.fixture(scope="module")
def channel(engine):
    with grpc.insecure_channel(engine.address) as channel:
        yield channel


@pytest.fixture
def inference(channel):
    return generate_pb2_grpc.InferenceServiceStub(channel)


@pytest.fixture
def control(channel):
    return control_pb2_grpc.ControlServiceStub(channel)


def stream_request(request: pb.GenerateRequest) -> pb.GenerateStreamRequest:
    return pb.GenerateStreamRequest.FromString(request.SerializeToString())


def collect(stream) -> tuple[list[pb.GenerateStreamResponse], str, list[int]]:
    messages = list(stream)
    deltas = [m.delta for m in messages if m.HasField("delta")]
    return messages, "".join(d.text for d in deltas), [t for d in deltas for t in d.token_ids]


def test_health_reports_serving_for_the_server_and_each_service(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "dpgate.v1.InferenceService", "dpgate.v1.ControlService"):
        assert (
            health.Check(health_pb2.HealthCheckRequest(service=service)).status
            == health_pb2.HealthCheckResponse.SERVING
        )


def test_reflection_lists_both_services(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {service.name for reply in replies for service in reply.list_services_response.service}
    assert {"dpgate.v1.InferenceService", "dpgate.v1.ControlService", "grpc.health.v1.Health"} <= names


def test_unary_greedy_generation_reports_length(inference):
    request = pb.GenerateRequest(
        request_id="unary-1",
        text="The capital of France is",
        sampling=GREEDY,
        stopping=pb.StoppingCriteria(max_tokens=8, ignore_eos=True),
    )
    reply = inference.Generate(request)
    assert reply.request_id == "unary-1"
    assert "Paris" in reply.text
    assert len(reply.token_ids) == 8
    assert reply.finish.reason == pb.FINISH_REASON_LENGTH
    assert (reply.finish.num_prompt_tokens, reply.finish.num_generated_tokens) == (5, 8)


def test_stream_is_prompt_info_then_deltas_then_finish_and_matches_unary(inference):
    request = pb.GenerateRequest(text="Once upon a time", sampling=GREEDY, stopping=pb.StoppingCriteria(max_tokens=12))
    unary = inference.Generate(request)
    messages, text, token_ids = collect(inference.GenerateStream(stream_request(request)))
    assert messages[0].HasField("prompt_info") and len(messages[0].prompt_info.prompt_token_ids) == 4
    assert messages[-1].HasField("finish")
    assert all(m.HasField("delta") for m in messages[1:-1])
    assert (text, token_ids) == (unary.text, list(unary.token_ids))


def test_the_models_eos_ends_a_chat_answer(inference):
    reply = inference.Generate(
        pb.GenerateRequest(text=CHAT_PROMPT, sampling=GREEDY, stopping=pb.StoppingCriteria(max_tokens=64))
    )
    assert reply.finish.reason == pb.FINISH_REASON_STOP
    assert reply.finish.stop_token_id == 2  # <|im_end|>
    assert "Paris" in reply.text and "<|im_end|>" not in reply.text


def test_a_stop_string_cuts_the_text_and_is_reported(inference):
    base = pb.GenerateRequest(
        text="Count: one, two, three,", sampling=GREEDY, stopping=pb.StoppingCriteria(max_tokens=24)
    )
    full = inference.Generate(base).text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    base.stopping.stop.append(stop)
    for reply_text, finish in (
        (lambda r: (r.text, r.finish))(inference.Generate(base)),
        (lambda c: (c[1], c[0][-1].finish))(collect(inference.GenerateStream(stream_request(base)))),
    ):
        assert reply_text == full[: full.index(stop)]
        assert finish.reason == pb.FINISH_REASON_STOP and finish.stop_string == stop


def test_a_user_stop_token_id_ends_generation(inference):
    base = pb.GenerateRequest(
        text="The alphabet: A, B, C,", sampling=GREEDY, stopping=pb.StoppingCriteria(max_tokens=16)
    )
    tokens = list(inference.Generate(base).token_ids)
    base.stopping.stop_token_ids.append(tokens[3])
    reply = inference.Generate(base)
    assert list(reply.token_ids) == tokens[: tokens.index(tokens[3]) + 1]
    assert reply.finish.stop_token_id == tokens[3]


def test_the_same_seed_gives_the_same_sample(inference):
    request = pb.GenerateRequest(
        text="My favourite animal is",
        sampling=pb.SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=1234),
        stopping=pb.StoppingCriteria(max_tokens=16, ignore_eos=True),
    )
    first, second = inference.Generate(request), inference.Generate(request)
    assert list(first.token_ids) == list(second.token_ids)
    request.sampling.seed = 99
    assert list(inference.Generate(request).token_ids) != list(first.token_ids)


def test_streamed_deltas_never_contain_broken_characters(inference):
    request = pb.GenerateRequest(
        text="日本の首都は東京です。中国の首都は",
        sampling=GREEDY,
        stopping=pb.StoppingCriteria(max_tokens=24, ignore_eos=True),
    )
    messages, text, _ = collect(inference.GenerateStream(stream_request(request)))
    deltas = [m.delta.text for m in messages if m.HasField("delta")]
    assert sum(len(d) > 0 for d in deltas) >= 5
    # Only a request that ends mid-character (max_tokens hit) may end in U+FFFD, in its last delta.
    assert all("\ufffd" not in delta for delta in deltas[:-1])
    assert text == inference.Generate(request).text


def test_logprobs_come_with_each_token(inference):
    request = pb.GenerateRequest(
        text="Hello", sampling=GREEDY, stopping=pb.StoppingCriteria(max_tokens=4), logprobs=pb.LogprobsOptions(top_n=3)
    )
    reply = inference.Generate(request)
    assert [lp.token_id for lp in reply.logprobs] == list(reply.token_ids)
    for lp in reply.logprobs:
        assert len(lp.top_logprobs) == 3 and lp.top_logprobs[0].token_id == lp.token_id  # greedy = most likely
        assert lp.logprob <= 0.0


def test_concurrent_calls_are_batched_and_each_completes_correctly(inference):
    """The served default is batch invariant: batched results equal sequential ones bit for bit,
    tokens and logprobs (once a first difference was allowed where the top two were tied)."""
    prompts = ["The sun is", "Python is a", "In 1492,", "Cats and dogs", "The ocean"]
    requests = [
        pb.GenerateRequest(
            text=p,
            sampling=GREEDY,
            stopping=pb.StoppingCriteria(max_tokens=10, ignore_eos=True),
            logprobs=pb.LogprobsOptions(top_n=2),
        )
        for p in prompts
    ]
    sequential = [inference.Generate(r) for r in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        concurrent = list(pool.map(inference.Generate, requests))
    for alone, batched in zip(sequential, concurrent, strict=True):
        assert len(batched.token_ids) == 10 and batched.finish.reason == pb.FINISH_REASON_LENGTH
        assert_identical(alone, batched)


def assert_identical(alone: pb.GenerateResponse, batched: pb.GenerateResponse) -> None:
    """Same text, token ids and logprobs (the top alternatives included), bit for bit."""
    assert (batched.text, list(batched.token_ids)) == (alone.text, list(alone.token_ids))
    assert list(batched.logprobs) == list(alone.logprobs)


def wait_for_idle(control, timeout: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        load = control.GetLoad(cpb.GetLoadRequest())
        if load.num_running == 0 and load.num_waiting == 0:
            return True
        time.sleep(0.02)
    return False


def test_a_cancelled_stream_stops_its_request(inference, control):
    request = pb.GenerateStreamRequest(
        text="Tell me a long story", stopping=pb.StoppingCriteria(max_tokens=4000, ignore_eos=True)
    )
    stream = inference.GenerateStream(request)
    for index, _ in enumerate(stream):
        if index == 3:
            break
    assert control.GetLoad(cpb.GetLoadRequest()).num_running == 1
    stream.cancel()
    assert wait_for_idle(control)


def test_abort_ends_a_running_request_with_aborted(inference, control):
    request = pb.GenerateRequest(
        request_id="abort-me", text="Write an essay", stopping=pb.StoppingCriteria(max_tokens=4000, ignore_eos=True)
    )
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(reply=inference.Generate(request)))
    worker.start()
    deadline = time.monotonic() + 5
    aborted: list[str] = []
    while not aborted and time.monotonic() < deadline:
        aborted = list(control.Abort(cpb.AbortRequest(request_ids=["abort-me", "unknown"])).aborted_request_ids)
        time.sleep(0.05)
    worker.join(timeout=5)
    assert aborted == ["abort-me"]
    assert result["reply"].finish.reason == pb.FINISH_REASON_ABORTED
    assert wait_for_idle(control)


def test_server_and_model_info(control):
    info = control.GetServerInfo(cpb.GetServerInfoRequest())
    assert info.model == MODEL and info.max_model_len == 8192
    assert (info.parallelism.data_parallel_rank, info.parallelism.data_parallel_size) == (0, 1)
    model = control.GetModelInfo(cpb.GetModelInfoRequest())
    # The served default for a packaged GGUF: float32 activations, the GGUF's blocks by integer
    # dot products on the batch-invariant kernels, on whichever instruction set this CPU has (the
    # reply names it, and the CPU's flags).
    assert (model.architecture, model.vocab_size, model.dtype, model.quantization) == (
        "llama",
        49152,
        "float32",
        "int-dot",
    )
    assert model.batch_invariant and model.kernels.startswith("batch-invariant/")
    assert "AVX2" in model.cpu and "AVX512-BF16" in model.cpu
    assert 2 in model.eos_token_ids


def test_the_thread_choice_is_reported_and_the_engine_thread_is_named(engine, control, inference):
    inference.Generate(pb.GenerateRequest(text="Hello", sampling=GREEDY, stopping=pb.StoppingCriteria(max_tokens=4)))
    model = control.GetModelInfo(cpb.GetModelInfoRequest())
    assert model.usable_cpus == len(os.sched_getaffinity(0))  # the engine inherits the test's CPUs
    tried = [trial.num_threads for trial in model.thread_trials]
    if model.usable_cpus == 1:
        assert (model.thread_source, model.num_threads, tried) == (cpb.THREAD_SOURCE_ONE_CPU, 1, [])
    else:
        assert model.thread_source == cpb.THREAD_SOURCE_MEASURED
        assert tried == candidates(model.usable_cpus) and model.num_threads in tried
        assert all(trial.one_row_step_ms > 0 and trial.batch_step_ms > 0 for trial in model.thread_trials)
    assert model.omp_wait_policy == os.environ.get("OMP_WAIT_POLICY", "default").lower()
    tasks = Path(f"/proc/{engine.process.pid}/task")
    assert "dpgate-engine" in [(task / "comm").read_text().strip() for task in tasks.iterdir()]  # top -H shows it


BAD_INPUTS = [
    (pb.GenerateRequest(), grpc.StatusCode.INVALID_ARGUMENT, "prompt must be set: give text or token_ids"),
    (pb.GenerateRequest(text=""), grpc.StatusCode.INVALID_ARGUMENT, "prompt text must not be empty"),
    (
        pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5] * 8192)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "prompt has 8192 tokens but must be shorter than the model's context of 8192 tokens",
    ),
    (
        pb.GenerateRequest(text="x", stopping=pb.StoppingCriteria(max_tokens=0)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "stopping.max_tokens must be >= 1",
    ),
    (
        pb.GenerateRequest(text="x", stopping=pb.StoppingCriteria(max_tokens=9000)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "stopping.max_tokens (9000) must be <= 8191: the prompt has 1 tokens and the model's context is 8192",
    ),
    (
        pb.GenerateRequest(text="x", sampling=pb.SamplingParams(temperature=-0.5)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "sampling.temperature must be 0 (greedy) or in [0.001, 100]",
    ),
    (
        pb.GenerateRequest(text="x", sampling=pb.SamplingParams(top_p=0.0)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "sampling.top_p must be in (0, 1]",
    ),
    (
        pb.GenerateRequest(text="x", sampling=pb.SamplingParams(top_p=1.5)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "sampling.top_p must be in (0, 1]",
    ),
    (
        pb.GenerateRequest(text="x", sampling=pb.SamplingParams(top_k=-3)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "sampling.top_k must be >= 0 (0 disables it)",
    ),
    (
        pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 49152])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "prompt token_ids 49152 must be < vocab size 49152",
    ),
    (
        pb.GenerateRequest(text="x", model="llama-70b"),
        grpc.StatusCode.NOT_FOUND,
        "model 'llama-70b' is not served here; this server serves 'smollm2-135m-instruct'",
    ),
]


@pytest.mark.parametrize(("request_", "code", "message"), BAD_INPUTS)
def test_bad_input_is_refused_with_the_field_and_rule_unary_and_streaming(inference, request_, code, message):
    with pytest.raises(grpc.RpcError) as unary:
        inference.Generate(request_)
    with pytest.raises(grpc.RpcError) as streamed:
        list(inference.GenerateStream(stream_request(request_)))
    for error in (unary.value, streamed.value):
        assert (error.code(), error.details()) == (code, message)


def test_bad_input_does_not_disturb_other_requests(inference):
    good = pb.GenerateRequest(
        text="Hello",
        sampling=GREEDY,
        stopping=pb.StoppingCriteria(max_tokens=6, ignore_eos=True),
        logprobs=pb.LogprobsOptions(top_n=2),
    )
    expected = inference.Generate(good)
    with ThreadPoolExecutor(4) as pool:
        bad = [pool.submit(inference.Generate, BAD_INPUTS[i % len(BAD_INPUTS)][0]) for i in range(8)]
        goods = [pool.submit(inference.Generate, good) for _ in range(3)]
        for future in goods:
            assert_identical(expected, future.result())
        assert all(isinstance(f.exception(), grpc.RpcError) for f in bad)


def test_the_engine_counts_its_requests_in_prometheus(engine):
    import urllib.request

    port = engine.process.args[engine.process.args.index("--metrics-port") + 1]
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'dpgate_engine_requests_total{code="OK",rpc="Generate"}' in body
    assert 'dpgate_engine_requests_total{code="INVALID_ARGUMENT",rpc="Generate"}' in body


def test_dpgate_generate_streams_a_completion_to_the_terminal(engine):
    import subprocess

    from tests.support.processes import dpgate_command

    command = dpgate_command("generate", "The capital of France is", "--address", engine.address, "--temperature", "0")
    ok = subprocess.run([*command, "--max-tokens", "8", "--verbose"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "Paris" in ok.stdout
    assert "[finish: length, 5 prompt + 8 generated tokens]" in ok.stderr

    bad = subprocess.run([*command, "--max-tokens", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert bad.stderr.strip() == "dpgate generate: INVALID_ARGUMENT: stopping.max_tokens must be >= 1"


def test_an_engine_capped_at_avx2_names_it_and_answers_with_the_same_bits(inference, tmp_path):
    """`--kernel-isa avx2` serves as an AVX2-only CPU would (every CPU this project runs on has AVX2):
    GetModelInfo names the cap, and the answer equals the default engine's bit for bit, whatever this
    CPU's fastest kernels are."""
    request = pb.GenerateRequest(
        text=CHAT_PROMPT, sampling=GREEDY, stopping=pb.StoppingCriteria(max_tokens=8),
        logprobs=pb.LogprobsOptions(top_n=2),
    )  # fmt: skip
    port = free_port()
    flags = ["engine", "--port", str(port), "--kernel-isa", "avx2"]
    log = str(tmp_path / "engine.log")
    with running(flags, port, log_path=log) as capped, grpc.insecure_channel(capped.address) as channel:
        model = control_pb2_grpc.ControlServiceStub(channel).GetModelInfo(cpb.GetModelInfoRequest())
        reply = generate_pb2_grpc.InferenceServiceStub(channel).Generate(request)
    assert model.kernels == "batch-invariant/avx2" and model.quantization == "int-dot"
    expected = inference.Generate(request)
    assert "Paris" in reply.text
    assert (reply.text, list(reply.token_ids), list(reply.logprobs)) == (
        expected.text, list(expected.token_ids), list(expected.logprobs),
    )  # fmt: skip
