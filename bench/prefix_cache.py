"""Prefix caching on against off: `dpgate engine` (SmolLM2, served default) over real gRPC, in the
same run, the same requests, one engine at a time (two at once on a 2-core machine would each
measure the other).

Three workloads, streamed with GenerateStream (TTFT = arrival to the first generated token):
  (a) multi-turn chat: 16 conversations x 8 turns in flight together, each turn the whole history
      (one 1,000-token system prompt shared by all, then 64-token user turns and the engine's own
      64-token answers) plus the new user turn;
  (b) one 1,500-token shared system prompt, 64 different 64-token questions, 16 in flight (one
      request with the system prompt alone runs first, untimed, in both modes);
  (c) 64 random 512-token prompts, nothing shared, 16 in flight: what the cache costs when it
      cannot hit.
Token ids are random (a prompt's content does not change the work). Greedy, eos ignored.

`--llamacpp` adds (a) as text over OpenAI's HTTP API, in the same run, against `dpgate serve` (the
gateway's HTTP port, cache on) and llama.cpp's server (llama-cpp-python's, prompt cache on; see
bench/llamacpp_server.py): the same words, the same 16 conversations in flight, streamed
completions of 64 tokens with the end-of-sequence tokens banned by logit_bias on both. That server
computes one request at a time, so its TTFT includes the wait behind the others.

    python bench/prefix_cache.py [--conversations 16] [--turns 8] [--system-tokens 1000]
        [--turn-tokens 64] [--shared-system-tokens 1500] [--questions 64] [--random-prompts 64]
        [--random-tokens 512] [--concurrency 16] [--only a b c] [--llamacpp] [--json FILE]

Targets (issue 23): on (a) and (b) TTFT p50 with the cache at most 0.3x of without and output
throughput at least 1.5x; on (c) throughput at least 0.97x.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
from results import add_json_argument, write_results

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from tests.support.processes import free_port, running

VOCAB = 49152


class Recorder:
    """Per-request TTFT and the tokens generated, over one workload's wall time."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.num_output = 0
        self.lock = threading.Lock()

    def stream(self, stub, prompt: list[int], max_tokens: int) -> list[int]:
        request = pb.GenerateStreamRequest(
            token_ids=pb.TokenIds(ids=prompt),
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        )
        started, first, tokens = time.perf_counter(), None, []
        for message in stub.GenerateStream(request, timeout=3600):
            if message.HasField("delta") and message.delta.token_ids:
                first = first or time.perf_counter()
                tokens.extend(message.delta.token_ids)
        with self.lock:
            self.ttft.append(first - started)
            self.num_output += len(tokens)
        return tokens


def tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(100, VOCAB) for _ in range(count)]


def multi_turn(stub, args, recorder: Recorder) -> None:
    rng = random.Random(1)
    system = tokens(rng, args.system_tokens)
    user_turns = [[tokens(rng, args.turn_tokens) for _ in range(args.turns)] for _ in range(args.conversations)]

    def conversation(index: int) -> None:
        history = list(system)
        for user in user_turns[index]:
            history += user
            history += recorder.stream(stub, history, args.turn_tokens)

    with ThreadPoolExecutor(args.conversations) as pool:
        list(pool.map(conversation, range(args.conversations)))


def shared_system(stub, args, recorder: Recorder) -> None:
    rng = random.Random(2)
    system = tokens(rng, args.shared_system_tokens)
    questions = [system + tokens(rng, args.turn_tokens) for _ in range(args.questions)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(lambda prompt: recorder.stream(stub, prompt, args.turn_tokens), questions))


def random_prompts(stub, args, recorder: Recorder) -> None:
    rng = random.Random(3)
    prompts = [tokens(rng, args.random_tokens) for _ in range(args.random_prompts)]
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(lambda prompt: recorder.stream(stub, prompt, args.turn_tokens), prompts))


WORKLOADS: dict[str, tuple[str, Callable]] = {
    "a": ("multi-turn chat", multi_turn),
    "b": ("shared system prompt", shared_system),
    "c": ("random prompts, nothing shared", random_prompts),
}


def warm_up(stub, args, case: str) -> None:
    """Untimed, in both modes: the kernels' first calls, and for (b) the system prompt alone."""
    recorder = Recorder()
    recorder.stream(stub, tokens(random.Random(9), 64), 4)
    if case == "b":
        recorder.stream(stub, tokens(random.Random(2), args.shared_system_tokens), 1)


def run_engine(args, caching: bool, case: str) -> dict:
    port = free_port()
    flags = ["engine", "--port", str(port), "--max-model-len", str(args.max_model_len),
             "--kv-cache-memory-mb", str(args.kv_cache_memory_mb), "--max-num-seqs", str(args.concurrency)]  # fmt: skip
    if not caching:
        flags.append("--no-prefix-caching")
    with running(flags, port, timeout=300) as engine, grpc.insecure_channel(engine.address) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        warm_up(stub, args, case)
        recorder = Recorder()
        started = time.perf_counter()
        WORKLOADS[case][1](stub, args, recorder)
        wall = time.perf_counter() - started
        load = control_pb2_grpc.ControlServiceStub(channel).GetLoad(cpb.GetLoadRequest())
    return {
        "prefix_caching": caching,
        "requests": len(recorder.ttft),
        "ttft_p50_ms": 1e3 * statistics.median(recorder.ttft),
        "output_tokens_per_s": recorder.num_output / wall,
        "wall_s": wall,
        "prefix_cache_query_tokens": load.prefix_cache_query_tokens,
        "prefix_cache_hit_tokens": load.prefix_cache_hit_tokens,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--conversations", type=int, default=16, help="(a) conversations in flight")
    add("--turns", type=int, default=8, help="(a) turns per conversation")
    add("--system-tokens", type=int, default=1000, help="(a) the shared system prompt")
    add("--turn-tokens", type=int, default=64, help="user turn, question and answer length, tokens")
    add("--shared-system-tokens", type=int, default=1500, help="(b) the shared system prompt")
    add("--questions", type=int, default=64, help="(b) questions")
    add("--random-prompts", type=int, default=64, help="(c) prompts")
    add("--random-tokens", type=int, default=512, help="(c) prompt length")
    add("--concurrency", type=int, default=16, help="(b), (c) requests in flight; the engines' --max-num-seqs")
    add("--only", nargs="+", choices=sorted(WORKLOADS), default=sorted(WORKLOADS), help="workloads to run")
    add("--max-model-len", type=int, default=4096)
    add("--kv-cache-memory-mb", type=int, default=2048, help="each engine's KV cache (default holds 44k tokens)")
    add("--llamacpp", action="store_true",
        help="also (a) as text over HTTP: dpgate serve vs llama.cpp's server (skipped unless built by "
        "bench/llamacpp_build.py)")  # fmt: skip
    add_json_argument(parser)
    args = parser.parse_args(argv)
    sizes = ("conversations", "turns", "system_tokens", "turn_tokens", "shared_system_tokens", "questions",
             "random_prompts", "random_tokens", "concurrency")  # fmt: skip
    for name in sizes:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    chat = args.system_tokens + 2 * args.turns * args.turn_tokens
    longest = max(chat, args.shared_system_tokens + 2 * args.turn_tokens, args.random_tokens + args.turn_tokens)
    if longest > args.max_model_len:
        parser.error(f"--max-model-len {args.max_model_len} is shorter than the longest prompt ({longest} tokens)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from machine import describe_machine

    print("SmolLM2-135M-Instruct served by `dpgate engine` (served default), prefix cache on vs off")
    print(describe_machine())
    print(f"{'workload':<34}{'cache':>6}{'reqs':>6}{'TTFT p50 ms':>13}{'out tok/s':>11}{'hit/query tokens':>20}")
    cases = []
    for case in args.only:
        name = WORKLOADS[case][0]
        runs = {}
        for caching in (False, True):
            run = runs[caching] = run_engine(args, caching, case)
            hits = f"{run['prefix_cache_hit_tokens']}/{run['prefix_cache_query_tokens']}"
            print(f"({case}) {name:<30}{'on' if caching else 'off':>6}{run['requests']:>6}{run['ttft_p50_ms']:>13.0f}"
                  f"{run['output_tokens_per_s']:>11.1f}{hits:>20}", flush=True)  # fmt: skip
        ttft = runs[True]["ttft_p50_ms"] / runs[False]["ttft_p50_ms"]
        rate = runs[True]["output_tokens_per_s"] / runs[False]["output_tokens_per_s"]
        print(f"({case}) on/off: TTFT p50 {ttft:.2f}x, output throughput {rate:.2f}x", flush=True)
        cases.append({"case": case, "name": name, "off": runs[False], "on": runs[True]})
    peers = []
    if args.llamacpp:
        from text_multi_turn import compare_with_llamacpp

        peers = compare_with_llamacpp(args)
    sizes = {name: getattr(args, name) for name in ("conversations", "turns", "system_tokens", "turn_tokens",
             "shared_system_tokens", "questions", "random_prompts", "random_tokens", "concurrency")}  # fmt: skip
    write_results(args.json, "prefix_cache", {"sizes": sizes, "cases": cases, "text_multi_turn": peers})


if __name__ == "__main__":
    main()
