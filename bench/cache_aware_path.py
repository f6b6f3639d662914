"""What the cache-aware path costs the gateway over the relay path, for a 1,000-token prompt.

One synthetic engine that publishes a prefix cache (bench/synthetic_engine.py --prefix-cache:
SmolLM2's tokenizer from GetTokenizer, an empty cached set from WatchKvEvents) and one `dpgate
gateway` in front of it. The same unary Generate of a `--prompt-tokens` text prompt is sent two
ways, interleaved in rounds: pinned (`x-data-parallel-rank: 0`: the relay path, no prompt read) and
unpinned (the cache-aware path: parse the request, tokenize the text off the loop, hash its
blocks, look them up, score the engines). Figures: p50/p99 at concurrency 1 (the difference is
what the path adds; target at most 0.3 ms p50) and, at `--concurrency`, calls/s and the gateway's
CPU per call from /proc, so calls/s one core sustains (target at least 1,000).

By default every call sends the same text, so after the first call the gateway finds all of it
in its cache of encoded pieces (gateway/piece_ids_cache.py): the case of a shared system prompt.
`--unique-tokens N` makes the last N tokens of every call's text its own (the rest shared), so each
call encodes its tail (and the shared piece the tail joins): a conversation's new turn.

    python bench/cache_aware_path.py [--prompt-tokens 1000] [--unique-tokens 0] [--calls 500] [--duration 2]
                                     [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway_overhead import (
    GENERATE,
    ROOT,
    percentile,
    process_cpu_seconds,
    start_process,
    stop_processes,
    wait_until_serving,
)
from grpc import aio
from results import add_json_argument, write_results

from dpgate.v1 import generate_pb2

WORDS = ["the", "cache", "routes", "prompts", "to", "the", "engine", "that", "holds", "their", "blocks"]
# 16 words of about one token each: a call's number, written in them, is its unique tail.
TAIL_WORDS = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree", "rock", "fish", "bird", "rain", "snow",
              "fire", "gold", "salt"]  # fmt: skip
PATHS = {"relay (pinned)": (("x-data-parallel-rank", "0"),), "cache-aware (unpinned)": ()}


def prompt_text(num_tokens: int) -> str:
    """Words that SmolLM2's tokenizer reads as about one token each."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(num_tokens))


class Requests:
    """The serialized Generate of every call: the same one, or one whose last `unique_tokens`
    words are the call's number written in TAIL_WORDS (unique for 16**unique_tokens calls)."""

    def __init__(self, prompt_tokens: int, unique_tokens: int) -> None:
        self.shared = prompt_text(prompt_tokens - unique_tokens)
        self.unique_tokens, self.count = unique_tokens, 0
        self.same = self._build(self.shared)

    def _build(self, text: str) -> bytes:
        stopping = generate_pb2.StoppingCriteria(max_tokens=1)
        return generate_pb2.GenerateRequest(text=text, stopping=stopping).SerializeToString()

    def next(self) -> bytes:
        if not self.unique_tokens:
            return self.same
        self.count += 1
        tail = " ".join(TAIL_WORDS[(self.count >> (4 * j)) & 15] for j in range(self.unique_tokens))
        return self._build(f"{self.shared} {tail}")


async def latencies(channel: aio.Channel, requests: Requests, metadata, num_calls: int) -> list[float]:
    call = channel.unary_unary(GENERATE)
    samples = []
    for _ in range(num_calls):
        request = requests.next()
        started = time.perf_counter()
        await call(request, metadata=metadata)
        samples.append(time.perf_counter() - started)
    return samples


async def rate(channel: aio.Channel, requests: Requests, metadata, concurrency: int, duration: float):
    """(calls, seconds) of `concurrency` callers for `duration` seconds."""
    call = channel.unary_unary(GENERATE)
    count, deadline = 0, time.perf_counter() + duration

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            await call(requests.next(), metadata=metadata)
            count += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count, time.perf_counter() - started


def hashed_prompt_tokens(metrics_port: int) -> float:
    """The gateway's count of prompt tokens it hashed for routing: proof the unpinned calls took
    the cache-aware path (a gateway that has not learned the tokenizer yet relays them)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("dpgate_gateway_hashed_prompt_tokens_total"))  # fmt: skip


async def measure(address: str, gateway_pid: int, metrics_port: int, requests: Requests, args) -> dict[str, list[dict]]:
    rounds: dict[str, list[dict]] = {name: [] for name in PATHS}
    request = requests.same
    async with aio.insecure_channel(address) as channel:
        await wait_until_serving(channel, request)
        deadline = time.monotonic() + 120
        while hashed_prompt_tokens(metrics_port) == 0:  # until the tokenizer is learned and the index up
            if time.monotonic() > deadline:
                raise SystemExit("the gateway never hashed a prompt: is the engine publishing its cache?")
            await channel.unary_unary(GENERATE)(request)
        for metadata in PATHS.values():  # warm-up: every path a few times
            for _ in range(20):
                await channel.unary_unary(GENERATE)(requests.next(), metadata=metadata)
        for round_number in range(args.repeats):
            names = list(PATHS) if round_number % 2 == 0 else list(PATHS)[::-1]
            for name in names:
                metadata = PATHS[name]
                samples = await latencies(channel, requests, metadata, args.calls)
                cpu_before = process_cpu_seconds(gateway_pid)
                count, seconds = await rate(channel, requests, metadata, args.concurrency, args.duration)
                cpu_us = 1e6 * (process_cpu_seconds(gateway_pid) - cpu_before) / count
                rounds[name].append({
                    "p50_ms": 1e3 * statistics.median(samples), "p99_ms": 1e3 * percentile(samples, 99),
                    "calls_per_s": count / seconds, "cpu_us_per_call": cpu_us,
                })  # fmt: skip
            print(f"round {round_number + 1}/{args.repeats} done", flush=True)
    return rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--unique-tokens", type=int, default=0,
                        help="the last N tokens of each call's prompt are its own (default 0: one prompt)")  # fmt: skip
    parser.add_argument("--calls", type=int, default=500, help="sequential calls per path per round (latency)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per throughput run")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds; each figure is their median")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    if args.prompt_tokens < 1 or args.calls < 2 or args.concurrency < 1 or args.repeats < 1 or args.duration <= 0:
        parser.error("--prompt-tokens, --concurrency and --repeats must be at least 1, --calls 2, --duration > 0")
    if not 0 <= args.unique_tokens < args.prompt_tokens:
        parser.error("--unique-tokens must be at least 0 and below --prompt-tokens")
    from machine import describe_machine

    python = sys.executable
    started = []
    try:
        engine, engine_address = start_process(
            [python, str(ROOT / "bench/synthetic_engine.py"), "--port", "0", "--num-tokens", "1", "--prefix-cache"],
            "listening on ",
        )
        started.append(engine)
        from dpgate.ports import free_port

        metrics_port = free_port()
        gateway, address = start_process(
            [python, "-m", "dpgate.cli", "gateway", "--port", "0", "--engine", engine_address,
             "--metrics-port", str(metrics_port)],
            "listening on ",
        )  # fmt: skip
        started.append(gateway)
        import uvloop

        requests = Requests(args.prompt_tokens, args.unique_tokens)
        rounds = uvloop.run(measure(address, gateway.pid, metrics_port, requests, args))
    finally:
        stop_processes(started)
    medians = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in rounds.items()}
    print(f"{describe_machine(with_torch=False)}; a {args.prompt_tokens}-token Generate text prompt ("
          f"{args.unique_tokens} tokens unique to each call), median of {args.repeats} interleaved rounds")  # fmt: skip
    print(f"{'path':<26}{'p50 ms':>9}{'p99 ms':>9}{'calls/s':>10}{'CPU us/call':>13}{'calls/s/core':>14}")
    for name, figures in medians.items():
        per_core = 1e6 / figures["cpu_us_per_call"]
        print(f"{name:<26}{figures['p50_ms']:>9.3f}{figures['p99_ms']:>9.3f}{figures['calls_per_s']:>10.0f}"
              f"{figures['cpu_us_per_call']:>13.0f}{per_core:>14.0f}")  # fmt: skip
    relay, aware = medians["relay (pinned)"], medians["cache-aware (unpinned)"]
    print(f"cache-aware path adds {aware['p50_ms'] - relay['p50_ms']:+.3f} ms p50 (target <= 0.3) and sustains "
          f"{1e6 / aware['cpu_us_per_call']:.0f} calls/s per core (target >= 1,000)")  # fmt: skip
    figures = {"prompt_tokens": args.prompt_tokens, "unique_tokens": args.unique_tokens, "paths": medians,
               "rounds": rounds}  # fmt: skip
    write_results(args.json, "cache_aware_path", figures, with_torch=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
