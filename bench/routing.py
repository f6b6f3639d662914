"""Routing policies side by side: `dpgate gateway` in front of N `dpgate engine`s (SmolLM2, served
default), every policy in the same run on the same engines and the same requests.

The engines start once; before each policy's run every engine's prefix cache is reset
(ResetPrefixCache) and a fresh gateway starts with `--policy P`. Each engine's KV cache is sized so
the workload's distinct prefix blocks are about `--cache-fraction` (0.7) of the cluster's blocks:
they fit the cluster but not one engine, so where a prompt goes decides whether it hits.

Workloads, streamed through the gateway with GenerateStream (TTFT = send to first token), random
token ids (a prompt's content does not change the work), greedy, eos ignored:
  (a) shared-prefix groups: G groups x P prompts, a group prefix of `--prefix-tokens`, a
      `--question-tokens` question, `--answer-tokens` answers, Poisson arrivals in a shuffled order
      (sglang bench_serving's generated-shared-prefix shape, scaled for CPU) at `--load` (0.7) of
      the cluster's capacity for these calls with a perfect cache, measured on the engines before
      the runs (bench/routing_capacity.py), or at a fixed `--rate`;
  (b) multi-turn chat through ChatStream: `--conversations` x `--turns`, each turn the whole
      conversation (a system prompt shared by all, the earlier turns with the model's own replies)
      plus a new user message, rendered by the engine's chat template (and, to route on the cache,
      by the gateway's copy of it); TTFT is send to the first delta with tokens; before each turn
      the user pauses (exponential, mean `--think-time`, 1 s), as real users do: turns sent back
      to back with a conversation or two per engine test the lock-step, not the routing (the
      engine a turn just left is the one with a free slot, so any least-loaded keeps it there);
  (c) random prompts, nothing shared, the same arrivals as (a);
  (d) one hot prefix carrying 80% of the calls of (a), the rest spread over the other groups.
Figures: TTFT p50/p90/p99, output tok/s, the engines' prefix-cache hit rate (hit / query tokens
from GetLoad, over the run) beside an oracle's (every block seen before hits: an infinite cache),
max/min calls per engine (from the `x-data-parallel-rank` trailer) and max/min work per engine (the
prompt tokens its cache did not hold plus the tokens it generated: load in tokens, as the policy
counts it).

    python bench/routing.py [--engines 4] [--groups 32] [--prompts-per-group 8] [--prefix-tokens 1000]
        [--question-tokens 64] [--answer-tokens 32] [--load 0.7 | --rate R] [--conversations 8] [--turns 4]
        [--think-time 1] [--gateways 1] [--policies ...] [--only a b c d] [--json FILE]

`--gateways 2` splits the calls over two gateway replicas (each follows every engine's events on
its own); compare its hit rate with one gateway's.

Targets (issue 26): on (a) and (b) cache-aware TTFT p50 at most 0.5x and throughput at least 1.5x
of the best other policy, hit rate at least 90% of the oracle's; on (c) throughput at least 0.97x
of least-loaded; on (d) p99 TTFT no worse than least-loaded and max/min load (work) within 2x.
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
from results import add_json_argument, write_results
from routing_capacity import measure_capacity

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from tests.support.gateway_processes import EngineProcess, GatewayProcess

VOCAB = 49152
BLOCK = 16
POLICIES = ("round-robin", "least-loaded", "power-of-two", "cache-aware")


class Recorder:
    """Per-call TTFT, generated tokens and the serving rank, over one run's wall time."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.num_output = 0
        self.ranks: Counter[int] = Counter()
        self.output_by_rank: Counter[int] = Counter()  # generated tokens per serving rank
        self.lock = threading.Lock()

    def stream(self, stub, prompt: list[int], max_tokens: int) -> list[int]:
        request = pb.GenerateStreamRequest(
            token_ids=pb.TokenIds(ids=prompt),
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        )
        started, first, tokens = time.perf_counter(), None, []
        call = stub.GenerateStream(request, timeout=3600)
        for message in call:
            if message.HasField("delta") and message.delta.token_ids:
                first = first or time.perf_counter()
                tokens.extend(message.delta.token_ids)
        rank = int(dict(call.trailing_metadata())["x-data-parallel-rank"])
        with self.lock:
            self.ttft.append(first - started)
            self.num_output += len(tokens)
            self.ranks[rank] += 1
            self.output_by_rank[rank] += len(tokens)
        return tokens

    def chat_stream(self, stub, messages: list[pb.ChatMessage], max_tokens: int) -> tuple[str, list[int]]:
        """One ChatStream call: the reply's text and the prompt's token ids (PromptInfo)."""
        request = pb.ChatStreamRequest(
            messages=messages,
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        )
        started, first, num_tokens, text, prompt = time.perf_counter(), None, 0, [], []
        call = stub.ChatStream(request, timeout=3600)
        for message in call:
            if message.HasField("prompt_info"):
                prompt = list(message.prompt_info.prompt_token_ids)
            elif message.HasField("delta"):
                if message.delta.token_ids:
                    first = first or time.perf_counter()
                    num_tokens += len(message.delta.token_ids)
                text.append(message.delta.content or message.delta.reasoning_content)
        rank = int(dict(call.trailing_metadata())["x-data-parallel-rank"])
        with self.lock:
            self.ttft.append(first - started)
            self.num_output += num_tokens
            self.ranks[rank] += 1
            self.output_by_rank[rank] += num_tokens
        return "".join(text), prompt


def tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(100, VOCAB) for _ in range(count)]


def grouped_prompts(args, hot: float | None) -> list[list[int]]:
    """(a) or, with `hot`, (d): the calls in their arrival order."""
    rng = random.Random(1)
    prefixes = [tokens(rng, args.prefix_tokens) for _ in range(args.groups)]
    count = args.groups * args.prompts_per_group
    if hot is None:
        groups = [g for g in range(args.groups) for _ in range(args.prompts_per_group)]
        rng.shuffle(groups)
    else:
        groups = [0 if rng.random() < hot else rng.randrange(1, args.groups) for _ in range(count)]
    return [prefixes[g] + tokens(rng, args.question_tokens) for g in groups]


def random_prompts(args) -> list[list[int]]:
    rng = random.Random(3)
    count = args.groups * args.prompts_per_group
    return [tokens(rng, args.prefix_tokens + args.question_tokens) for _ in range(count)]


def poisson(stub, args, prompts: list[list[int]], recorder: Recorder) -> None:
    """Send `prompts` at Poisson arrivals of `--rate` calls/s, each on its own thread."""
    rng = random.Random(4)
    with ThreadPoolExecutor(min(256, len(prompts))) as pool:
        futures = []
        for prompt in prompts:
            futures.append(pool.submit(recorder.stream, stub, prompt, args.answer_tokens))
            time.sleep(rng.expovariate(args.rate))
        for future in futures:
            future.result()


WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "as", "with", "by", "at", "from", "that",
         "this", "which", "are", "be", "or", "an", "it", "not", "have", "has", "cache", "route", "engine",
         "gateway", "prefix", "block", "token", "prompt", "answer", "question", "model", "serve", "request",
         "policy"]  # fmt: skip


def words(rng: random.Random, count: int) -> str:
    """About `count` tokens of English-like text (SmolLM2 spends about one token per common word)."""
    return " ".join(rng.choice(WORDS) for _ in range(count))


def multi_turn(stub, args, recorder: Recorder) -> list[list[int]]:
    """(b): the conversations run side by side, each turn after the previous reply and a pause; returns every
    call's prompt token ids (as the engine reported them) for the oracle."""
    rng = random.Random(2)
    system = words(rng, args.prefix_tokens // 4)
    turns = [[words(rng, args.question_tokens) for _ in range(args.turns)] for _ in range(args.conversations)]
    sent: list[list[int]] = []
    lock = threading.Lock()

    def conversation(index: int) -> None:
        own = words(random.Random(100 + index), args.prefix_tokens // 2)
        pauses = random.Random(200 + index)
        history = [pb.ChatMessage(role=pb.CHAT_ROLE_SYSTEM, content=f"{system}\n{own}")]
        for user in turns[index]:
            if args.think_time:  # the user reads, then types: an exponential pause before each turn
                time.sleep(pauses.expovariate(1.0 / args.think_time))
            history.append(pb.ChatMessage(role=pb.CHAT_ROLE_USER, content=user))
            reply, prompt = recorder.chat_stream(stub, history, args.answer_tokens)
            with lock:
                sent.append(prompt)
            history.append(pb.ChatMessage(role=pb.CHAT_ROLE_ASSISTANT, content=reply))

    with ThreadPoolExecutor(args.conversations) as pool:
        list(pool.map(conversation, range(args.conversations)))
    return sent


def oracle_hit_rate(prompts: list[list[int]]) -> float:
    """Cached prompt tokens over prompt tokens if every block ever computed stayed cached anywhere."""
    seen: set[tuple[int, ...]] = set()
    hits = total = 0
    for prompt in prompts:
        total += len(prompt)
        limit = (len(prompt) - 1) // BLOCK
        matched = True
        for i in range(len(prompt) // BLOCK):
            key = tuple(prompt[: (i + 1) * BLOCK])
            if matched and i < limit and key in seen:
                hits += BLOCK
            else:
                matched = False
            seen.add(key)
    return hits / total if total else 0.0


def engine_counts(engines: list[EngineProcess]) -> list[tuple[int, int]]:
    """Each engine's (prompt tokens looked up in its prefix cache, tokens found there), from GetLoad."""
    counts = []
    for engine in engines:
        load = engine.load()
        counts.append((load.prefix_cache_query_tokens, load.prefix_cache_hit_tokens))
    return counts


def work_per_engine(before: list[tuple[int, int]], after: list[tuple[int, int]], output: Counter) -> list[int]:
    """Tokens each engine computed over a run: the prompt tokens its cache did not hold plus the
    tokens it generated. This is the load a balance bound is about: a hot prefix's calls cost the
    engine that caches it little each, so counting calls would call a fair split lopsided."""
    return [
        (query1 - query0) - (hit1 - hit0) + output.get(rank, 0)
        for rank, ((query0, hit0), (query1, hit1)) in enumerate(zip(before, after, strict=True))
    ]


def reset_caches(engines: list[EngineProcess]) -> None:
    for engine in engines:
        with grpc.insecure_channel(engine.address) as channel:
            control_pb2_grpc.ControlServiceStub(channel).ResetPrefixCache(cpb.ResetPrefixCacheRequest(), timeout=30)


class Stubs:
    """The gateways' stubs taken in turn, call by call: N gateway replicas splitting the traffic."""

    def __init__(self, stubs: list) -> None:
        self._stubs, self._next, self._lock = stubs, 0, threading.Lock()

    def __getattr__(self, name: str):
        with self._lock:
            stub = self._stubs[self._next % len(self._stubs)]
            self._next += 1
        return getattr(stub, name)


def run_case(case: str, policy: str, engines: list[EngineProcess], args, log_dir: Path) -> dict:
    reset_caches(engines)
    flags = ["--policy", policy, "--health-interval", "0.25", "--health-timeout", "0.25", *args.gateway_flags.split()]
    gateways: list[GatewayProcess] = []
    channels: list[grpc.Channel] = []
    try:
        for replica in range(args.gateways):
            name = f"gateway-{policy}-{replica}"
            gateways.append(GatewayProcess([e.address for e in engines], *flags, log_dir=log_dir, name=name))
        for gateway in gateways:
            gateway.wait_ranks(list(range(len(engines))), timeout=60)
        time.sleep(1.0)  # the gateways follow every engine's events and have learned the tokenizer
        channels = [grpc.insecure_channel(gateway.address) for gateway in gateways]
        stub = Stubs([generate_pb2_grpc.InferenceServiceStub(channel) for channel in channels])
        recorder = Recorder()
        before = engine_counts(engines)
        started = time.perf_counter()
        if case == "b":
            prompts = multi_turn(stub, args, recorder)
        else:
            prompts = CASES[case][1](args)
            poisson(stub, args, prompts, recorder)
        wall = time.perf_counter() - started
        after = engine_counts(engines)
    finally:
        for channel in channels:
            channel.close()
        for gateway in gateways:
            gateway.stop()
    ttft = sorted(recorder.ttft)
    calls = [recorder.ranks.get(rank, 0) for rank in range(len(engines))]
    work = work_per_engine(before, after, recorder.output_by_rank)
    query, hit = (sum(a[i] - b[i] for a, b in zip(after, before, strict=True)) for i in (0, 1))
    return {
        "requests": len(ttft),
        "gateways": args.gateways,
        "ttft_p50_ms": 1e3 * statistics.median(ttft),
        "ttft_p90_ms": 1e3 * ttft[min(len(ttft) - 1, int(0.9 * len(ttft)))],
        "ttft_p99_ms": 1e3 * ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
        "output_tokens_per_s": recorder.num_output / wall,
        "wall_s": wall,
        "hit_rate": hit / max(1, query),
        "oracle_hit_rate": oracle_hit_rate(prompts),
        "calls_per_engine": calls,
        "max_min_calls": max(calls) / max(1, min(calls)),
        "work_tokens_per_engine": work,
        "max_min_work": max(work) / max(1, min(work)),
    }


CASES: dict[str, tuple[str, Callable]] = {
    "a": ("shared-prefix groups", lambda args: grouped_prompts(args, None)),
    "b": ("multi-turn chat", None),
    "c": ("random prompts, nothing shared", random_prompts),
    "d": ("one hot prefix, 80% of calls", lambda args: grouped_prompts(args, 0.8)),
}


def kv_blocks_per_engine(args) -> int:
    """Blocks so the groups' prefixes fill `--cache-fraction` of the cluster, yet one engine can
    always hold the calls in flight (`--max-num-seqs` prompts of the longest length)."""
    prefix_blocks = args.groups * (args.prefix_tokens // BLOCK)
    by_fraction = int(prefix_blocks / (args.cache_fraction * args.engines)) + 1
    longest = args.prefix_tokens + args.question_tokens * (args.turns + 1) + args.answer_tokens * (args.turns + 1)
    working = args.max_num_seqs * (longest // BLOCK + 2)
    return max(by_fraction, working)


class SizedEngine(EngineProcess):
    def __init__(self, rank: int, size: int, log_dir: Path, flags: list[str]) -> None:
        super().__init__(Path("."), rank, size, log_dir)
        self.flags = flags

    def command(self) -> list[str]:
        base = super().command()
        model = base.index("--model")
        return base[:model] + base[model + 2 :] + self.flags  # the packaged SmolLM2 by default


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--engines", type=int, default=4, help="engines behind the gateway")
    add("--gateways", type=int, default=1, help="gateway replicas, each following every engine; calls alternate")
    add("--groups", type=int, default=32, help="(a), (d) prefix groups")
    add("--prompts-per-group", type=int, default=8, help="(a) prompts per group; (c), (d) use groups x this")
    add("--prefix-tokens", type=int, default=1000, help="group prefix (and (c) prompt) length, tokens")
    add("--question-tokens", type=int, default=64, help="question / user turn length, tokens")
    add("--answer-tokens", type=int, default=32, help="tokens generated per call")
    add("--load", type=float, default=0.7, help="(a), (c), (d) arrivals as a share of the cluster's capacity")
    add("--rate", type=float, help="(a), (c), (d) Poisson arrivals in calls per second instead of --load")
    add("--conversations", type=int, default=8, help="(b) conversations in flight")
    add("--turns", type=int, default=4, help="(b) turns per conversation")
    add("--think-time", type=float, default=1.0,
        help="(b) mean seconds a user pauses before each turn (exponential; 0: turns back to back)")  # fmt: skip
    add("--cache-fraction", type=float, default=0.7, help="the prefixes' share of the cluster's KV blocks")
    add("--max-num-seqs", type=int, default=8, help="each engine's --max-num-seqs")
    add("--threads", type=int, default=1, help="each engine's --num-threads")
    add("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    add("--gateway-flags", default="", metavar="FLAGS",
        help="more `dpgate gateway` flags for every policy's gateway, one string (e.g. '--cache-prefill-weight 4')")
    add("--only", nargs="+", choices=sorted(CASES), default=sorted(CASES), help="workloads to run")
    add_json_argument(parser)
    args = parser.parse_args(argv)
    for name in ("engines", "gateways", "groups", "prompts_per_group", "prefix_tokens", "question_tokens",
                 "answer_tokens", "conversations", "turns", "max_num_seqs", "threads"):  # fmt: skip
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if (args.rate is not None and args.rate <= 0) or args.load <= 0:
        parser.error("--rate and --load must be above 0")
    if not 0 < args.cache_fraction <= 1 or args.think_time < 0:
        parser.error("--cache-fraction must be in (0, 1] and --think-time at least 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # SIGTERM (`kill PID`, a scheduler's timeout) ends the run through the `finally`s below, so the
    # engines and gateways it started stop with it: by default they ran on as orphans.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    import tempfile

    from machine import describe_machine

    blocks = kv_blocks_per_engine(args)
    longest = args.prefix_tokens + (args.question_tokens + args.answer_tokens) * (args.turns + 1)
    max_model_len = max(512, -(-longest // 256) * 256)
    flags = ["--num-kv-blocks", str(blocks), "--max-model-len", str(max_model_len),
             "--max-num-seqs", str(args.max_num_seqs), "--num-threads", str(args.threads)]  # fmt: skip
    print(f"SmolLM2-135M-Instruct: {args.engines} `dpgate engine`s of {blocks} KV blocks each behind `dpgate gateway`")
    print(describe_machine())
    log_dir = Path(tempfile.mkdtemp(prefix="dpgate-routing-"))
    engines = [SizedEngine(rank, args.engines, log_dir, flags) for rank in range(args.engines)]
    header = f"{'workload':<34}{'policy':>14}{'reqs':>6}{'p50':>8}{'p90':>8}{'p99 ms':>8}{'tok/s':>8}"
    print(header + f"{'hit':>7}{'oracle':>8}{'calls':>7}{'work':>8}  (max/min per engine)")
    cases = []
    capacity = None
    try:
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_serving(600)
        if args.rate is None and set(args.only) - {"b"}:
            capacity = measure_capacity([engine.address for engine in engines], args)
            args.rate = args.load * capacity.calls_per_s
            print(f"capacity for (a)'s calls: {capacity.calls_per_s:.2f} calls/s ({capacity.misses_per_s:.2f} "
                  f"computing whole prompts, {capacity.hits_per_s:.2f} with the prefix cached, "
                  f"{capacity.first_call_share:.0%} first calls); "
                  f"arrivals at {args.load:g} x = {args.rate:.2f} calls/s", flush=True)  # fmt: skip
        for case in args.only:
            name = CASES[case][0]
            runs = {}
            for policy in args.policies:
                run = runs[policy] = run_case(case, policy, engines, args, log_dir)
                print(f"({case}) {name:<30}{policy:>14}{run['requests']:>6}{run['ttft_p50_ms']:>8.0f}"
                      f"{run['ttft_p90_ms']:>8.0f}{run['ttft_p99_ms']:>8.0f}{run['output_tokens_per_s']:>8.1f}"
                      f"{run['hit_rate']:>7.2f}{run['oracle_hit_rate']:>8.2f}{run['max_min_calls']:>7.2f}"
                      f"{run['max_min_work']:>8.2f}",
                      flush=True)  # fmt: skip
            cases.append({"case": case, "name": name, "runs": runs})
    finally:
        for engine in engines:
            engine.stop()
    sizes = {name: getattr(args, name) for name in ("engines", "groups", "prompts_per_group", "prefix_tokens",
             "question_tokens", "answer_tokens", "rate", "load", "conversations", "turns", "think_time",
             "cache_fraction", "max_num_seqs", "gateways", "gateway_flags")}  # fmt: skip
    sizes["kv_blocks_per_engine"] = blocks
    if capacity is not None:
        sizes["capacity_calls_per_s"] = round(capacity.calls_per_s, 3)
        sizes["capacity_misses_per_s"] = round(capacity.misses_per_s, 3)
        sizes["capacity_hits_per_s"] = round(capacity.hits_per_s, 3)
    write_results(args.json, "routing", {"sizes": sizes, "policies": list(args.policies), "cases": cases})


if __name__ == "__main__":
    main()
