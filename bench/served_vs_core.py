"""dpgate as served against its own engine core, same machine, same run: the ceiling and what a user gets.

The served side is `dpgate engine` (the default model and flags) called over gRPC on 127.0.0.1 by
`GenerateStream`; the core side is the same engine built in this process by the server's own
start-up (`start_model` with `EngineConfig()`'s defaults) and stepped by `LLMEngine.step()` on this
process's main thread. Two figures, interleaved core/served `--repeats` times so a busy machine's
load falls on both alike (the best of each is printed, with every run in the JSON):

- batch 1: one request, `--decode-tokens` greedy tokens from a short text prompt; decode tok/s =
  (tokens - 1) / (time from the first token to the last), prompt and start-up not counted;
- 16 in flight: `--concurrency` requests of `--prompt-tokens` random token ids, each generating
  `--output-tokens` (eos ignored), all sent at once; output tok/s end to end = all generated
  tokens / (first send to last token).

Served / core at least 0.9 is the target (issue 24): below it, something outside the step (the
event loop, gRPC, the engine thread) costs speed.

    python bench/served_vs_core.py [--repeats 3] [--decode-tokens 128] [--concurrency 16]
                                   [--prompt-tokens 256] [--output-tokens 128] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from machine import describe_machine
from results import add_json_argument, write_results

from dpgate.ports import free_port
from dpgate.v1 import control_pb2, control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The history of the printing press begins"


def random_prompts(count: int, length: int, vocab_size: int = 49152) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(100, vocab_size) for _ in range(length)] for _ in range(count)]


def text_request(num_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        text=PROMPT,
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_tokens=num_tokens, ignore_eos=True),
    )


def ids_request(request_id: str, prompt: list[int], num_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        token_ids=pb.TokenIds(ids=prompt),
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_tokens=num_tokens, ignore_eos=True),
    )


class Core:
    """The engine core as `dpgate engine` builds it with its default flags, stepped on this thread."""

    def __init__(self):
        from engines.config import EngineConfig
        from engines.engine import LLMEngine
        from engines.model.source import resolve_model
        from engines.serving.request_builder import ModelLimits
        from engines.serving.server import numerics_for
        from engines.serving.startup import freeze_startup_heap, start_model

        config = EngineConfig()
        source = resolve_model(config.model)
        model = start_model(config, source, numerics_for(config, source))
        self.tokenizer = model.loaded.tokenizer
        self.engine = LLMEngine(model.runner, config.scheduler_config)
        self.limits = ModelLimits(source.name, model.loaded.config.vocab_size, model.max_model_len,
                                  self.tokenizer.eos_token_ids)  # fmt: skip
        self.threads = model.threads.describe()
        freeze_startup_heap()
        self.next_id = 0

    def _add(self, request: pb.GenerateRequest) -> None:
        from engines.serving.request_builder import build_sequence

        request.request_id = f"core-{self.next_id}"
        self.next_id += 1
        self.engine.add(build_sequence(request, self.limits, self.tokenizer.tokenizer))

    def decode_rate(self, num_tokens: int) -> float:
        self._add(text_request(num_tokens))
        times = []
        while self.engine.has_work:
            for output in self.engine.step():
                times.extend([time.perf_counter()] * len(output.token_ids))
        return (len(times) - 1) / (times[-1] - times[0])

    def in_flight_rate(self, prompts: list[list[int]], num_tokens: int) -> float:
        started = time.perf_counter()
        for prompt in prompts:
            self._add(ids_request("", prompt, num_tokens))
        generated = 0
        while self.engine.has_work:
            generated += sum(len(output.token_ids) for output in self.engine.step())
        return generated / (time.perf_counter() - started)


async def served_decode_rate(stub, num_tokens: int) -> float:
    times = []
    async for message in stub.GenerateStream(text_request(num_tokens)):
        if message.HasField("delta"):
            times.extend([time.perf_counter()] * len(message.delta.token_ids))
    return (len(times) - 1) / (times[-1] - times[0])


async def served_in_flight_rate(stub, prompts: list[list[int]], num_tokens: int, run: int) -> float:
    async def one(index: int, prompt: list[int]) -> int:
        count = 0
        async for message in stub.GenerateStream(ids_request(f"served-{run}-{index}", prompt, num_tokens)):
            if message.HasField("delta"):
                count += len(message.delta.token_ids)
        return count

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(index, prompt) for index, prompt in enumerate(prompts)))
    return sum(counts) / (time.perf_counter() - started)


def start_engine(port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "dpgate.cli", "engine", "--port", str(port)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


async def wait_serving(stub, engine: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine.poll() is not None:
            raise SystemExit(f"dpgate engine exited with status {engine.returncode}:\n{engine.stderr.read()}")
        try:
            await stub.Generate(text_request(1), timeout=5)
            return
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.5)
    raise SystemExit(f"dpgate engine did not answer within {timeout:.0f} s")


def stop_engine(engine: subprocess.Popen) -> None:
    if engine.poll() is None:
        engine.send_signal(signal.SIGTERM)
        try:
            engine.wait(timeout=20)
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait()


class ServedEngine:
    """`dpgate engine` with its default flags for the length of a `with` block, for benches that
    put the served figure beside their in-process ones (one engine process, many calls)."""

    def __enter__(self) -> ServedEngine:
        self.port = free_port()
        self.engine = start_engine(self.port)
        asyncio.run(self._call(lambda stub: wait_serving(stub, self.engine)))
        return self

    def __exit__(self, *exc_info) -> None:
        stop_engine(self.engine)

    async def _call(self, work):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            return await work(generate_pb2_grpc.InferenceServiceStub(channel))

    def decode_rate(self, num_tokens: int) -> float:
        """Batch-1 decode tok/s of one streamed request (the same prompt and rule as the core's)."""
        return asyncio.run(self._call(lambda stub: served_decode_rate(stub, num_tokens)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    add_json_argument(parser)
    args = parser.parse_args()

    # The core first, then the engine: the engine's start-up thread trial must not run while the
    # core loads and warms up beside it (two busy teams on the same CPUs made 2 threads look ten
    # times slower than 1 in the trial, so the served engine chose 1 thread for the whole run).
    core = Core()
    port = free_port()
    engine = start_engine(port)
    try:
        print(describe_machine())
        print(f"SmolLM2-135M-Instruct, served default; core and served interleaved, {args.repeats} repeats "
              f"(figures from a machine that may be shared: the best of each is the comparison)")  # fmt: skip
        runs = asyncio.run(measure(core, engine, port, args))
    finally:
        stop_engine(engine)
    results = {"runs": runs, **{key: value for key, value in vars(args).items() if key != "json"}}
    for figure in ("batch1_decode", "in_flight"):
        best_core = max(run["core"] for run in runs[figure])
        best_served = max(run["served"] for run in runs[figure])
        results[figure] = {"core": best_core, "served": best_served, "ratio": best_served / best_core}
        label = "batch-1 decode tok/s" if figure == "batch1_decode" else f"{args.concurrency} in flight output tok/s"
        print(f"  {label:<32} core {best_core:7.1f}  served {best_served:7.1f}  "
              f"served/core {best_served / best_core:.2f}x")  # fmt: skip
    write_results(args.json, "served_vs_core", results)


async def measure(core: Core, engine: subprocess.Popen, port: int, args: argparse.Namespace) -> dict:
    prompts = random_prompts(args.concurrency, args.prompt_tokens)
    runs: dict = {"batch1_decode": [], "in_flight": []}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        await wait_serving(stub, engine)
        info = await control_pb2_grpc.ControlServiceStub(channel).GetModelInfo(control_pb2.GetModelInfoRequest())
        runs["threads"] = {
            "core": core.threads,
            "served": f"{info.num_threads} thread(s), "
            f"{control_pb2.ThreadSource.Name(info.thread_source)}, wait policy {info.omp_wait_policy}",
        }
        print(f"  threads: core {runs['threads']['core']}\n           served {runs['threads']['served']}")
        for run in range(args.repeats):
            figures = {"core": core.decode_rate(args.decode_tokens),
                       "served": await served_decode_rate(stub, args.decode_tokens)}  # fmt: skip
            runs["batch1_decode"].append(figures)
            print(f"  run {run}: batch 1      core {figures['core']:7.1f}  served {figures['served']:7.1f} tok/s",
                  flush=True)  # fmt: skip
            # Prompts differ by run (first token changed) so neither side's prefix cache serves them.
            fresh = [[100 + run, *prompt[1:]] for prompt in prompts]
            figures = {"core": core.in_flight_rate(fresh, args.output_tokens),
                       "served": await served_in_flight_rate(stub, fresh, args.output_tokens, run)}  # fmt: skip
            runs["in_flight"].append(figures)
            print(f"  run {run}: {args.concurrency} in flight core {figures['core']:7.1f}  "
                  f"served {figures['served']:7.1f} output tok/s", flush=True)  # fmt: skip
    return runs


if __name__ == "__main__":
    main()
