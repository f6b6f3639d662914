"""Serving throughput: the dpgate engine against transformers on the same requests, same run.

64 requests of 256 prompt tokens each generate 128 tokens (eos ignored) with 16 in flight. dpgate
runs them with continuous batching through its engine core (`LLMEngine`, the loop behind the gRPC
server) three times: as served (batch-invariant kernels; float32 activations, int-dot over the GGUF's blocks),
on torch's kernels with the same dtype and weights (what batch invariance costs), and as served
before the kernels existed (torch's kernels, bfloat16 + int8).
transformers runs them one at a time (`generate`) and with its own static batching (16 prompts
per `generate` call, one batch after another), in bfloat16 where the CPU has it natively and
float32 elsewhere. Greedy everywhere. Each system runs in its own subprocess so peak memory (max
RSS) is its own. The CPU and its flags are printed with the figures.

    python bench/throughput.py [--requests 64] [--sequential-requests 8] [--profile] [--isa avx2]
                               [--concurrencies 1 2 4 8 16] [--output-tokens 128] [--json FILE]

Sequential transformers is slow (about 20 tokens/s); `--sequential-requests` runs it on the
first N requests only and says so: its tokens/s is a rate and does not depend on N. `--isa avx2`
caps dpgate's kernels at AVX2 and runs transformers in float32, as on an AVX2-only CPU (cap
torch too: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2);
`--no-transformers` skips the peers.

`--concurrencies` also sweeps the number in flight (bench/report.py plots it): dpgate as served
runs 4 waves at each concurrency C (C/16 of `--requests`, the main run's own proportion), and
transformers one static batch of C prompts (its rate does not depend on the number of batches);
C = 16 reuses the main runs, C = 1 transformers' sequential run. `--output-tokens` shortens the
generations for a smoke test (bench/report.py --quick).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time

from results import add_json_argument, write_results
from step_clock import timed_greedy_generate

PROMPT_TOKENS, CONCURRENCY = 256, 16
OUTPUT_TOKENS = 128  # --output-tokens changes it (in each subprocess too)


def make_prompts(count: int, vocab_size: int = 49152) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(100, vocab_size) for _ in range(PROMPT_TOKENS)] for _ in range(count)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summarize(name, started, finished, first_token, done, num_tokens) -> dict:
    """started/first_token/done: per-request perf_counter times."""
    ttft = [first_token[i] - started[i] for i in range(len(started))]
    tpot = [(done[i] - first_token[i]) / (num_tokens - 1) for i in range(len(started))]
    wall = finished - min(started)
    return {
        "system": name,
        "requests": len(started),
        "output_tokens_per_s": len(started) * num_tokens / wall,
        "ttft_p50_ms": 1e3 * statistics.median(ttft),
        "ttft_p90_ms": 1e3 * percentile(ttft, 90),
        "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "tpot_p50_ms": 1e3 * statistics.median(tpot),
        "tpot_p90_ms": 1e3 * percentile(tpot, 90),
        "tpot_p99_ms": 1e3 * percentile(tpot, 99),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def load_dpgate(kernels: str, isa: str | None, output_tokens: int):
    """kernels: "served" (batch-invariant), "torch" (same dtype and weights on torch's kernels) or
    "old-default" (torch's kernels in bfloat16 + int8, as served before the kernels existed).
    Returns (loaded model, runner sized and warmed for CONCURRENCY in flight, numerics)."""
    from machine import engine_numerics

    from engines.model.source import resolve_model
    from engines.runner.loader import load_for_serving
    from engines.runner.model_runner import ModelRunner

    served = engine_numerics(True, isa)
    numerics = {
        "served": served,
        "torch": engine_numerics(False, dtype=served.dtype),
        "old-default": engine_numerics(False, dtype="bfloat16"),
    }[kernels]
    loaded = load_for_serving(resolve_model("smollm2-135m-instruct"), numerics)
    max_len = PROMPT_TOKENS + output_tokens
    runner = ModelRunner(loaded, max_len, num_blocks=CONCURRENCY * max_len // 16 + 16, block_size=16)
    runner.warm_up(CONCURRENCY, 512)
    return loaded, runner, numerics


def run_dpgate(
    loaded, runner, numerics, num_requests: int, concurrency: int, output_tokens: int, profile: bool
) -> dict:
    """Serve `num_requests` with at most `concurrency` in flight on a fresh engine over `runner`."""
    from dpgate.v1 import generate_pb2 as pb
    from engines.engine import LLMEngine
    from engines.scheduling.scheduler import SchedulerConfig
    from engines.serving.request_builder import ModelLimits, build_sequence

    engine = LLMEngine(runner, SchedulerConfig(max_num_seqs=concurrency, max_num_batched_tokens=512))
    max_len = PROMPT_TOKENS + output_tokens
    limits = ModelLimits("m", loaded.config.vocab_size, max_len, loaded.tokenizer.eos_token_ids)
    prompts = make_prompts(num_requests)
    started, first_token, done = {}, {}, {}
    next_request = 0

    def submit(i: int) -> None:
        request = pb.GenerateRequest(
            request_id=str(i),
            token_ids=pb.TokenIds(ids=prompts[i]),
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingCriteria(max_tokens=output_tokens, ignore_eos=True),
        )
        engine.add(build_sequence(request, limits, loaded.tokenizer.tokenizer))
        started[i] = time.perf_counter()

    while len(done) < num_requests:
        while next_request < num_requests and next_request - len(done) < concurrency:
            submit(next_request)
            next_request += 1
        if profile and len(first_token) == concurrency and not hasattr(run_dpgate, "profiled"):
            run_dpgate.profiled = True
            profile_decode_step(engine)
        for output in engine.step():
            i = int(output.request_id)
            now = time.perf_counter()
            first_token.setdefault(i, now)
            if output.finish_reason is not None:
                done[i] = now
    order = range(num_requests)
    return summarize(
        f"dpgate {numerics.dtype}+{numerics.quantization} {numerics.kernels}",
        [started[i] for i in order],
        max(done.values()),
        [first_token[i] for i in order],
        [done[i] for i in order],
        output_tokens,
    )


def sweep_requests(concurrency: int, main_requests: int) -> int:
    """Requests at one concurrency of the sweep: the main run's waves (main_requests / 16) at C."""
    return max(concurrency, main_requests * concurrency // CONCURRENCY)


def profile_decode_step(engine) -> None:
    """Where a decode step of the full batch spends its time (printed to stderr)."""
    from torch.profiler import profile

    with profile() as prof:
        engine.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), file=sys.stderr)


def load_transformers(isa: str | None):
    from machine import transformers_dtype
    from transformers import AutoModelForCausalLM

    from engines.model.source import resolve_model

    path = resolve_model("smollm2-135m-instruct").path
    dtype = transformers_dtype(isa)
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).eval(), dtype


def run_transformers(model, dtype, num_requests: int, batch_size: int, output_tokens: int) -> dict:
    import torch

    prompts = make_prompts(num_requests)
    started, first_token, done = [], [], []
    for begin in range(0, num_requests, batch_size):
        batch = torch.tensor(prompts[begin : begin + batch_size])
        t0 = time.perf_counter()
        clock = timed_greedy_generate(model, batch, output_tokens)
        finished = time.perf_counter()
        for _ in range(batch.shape[0]):
            started.append(t0)
            first_token.append(clock.times[0])
            done.append(finished)
    name = f"transformers {str(dtype)[6:]} " + ("sequential" if batch_size == 1 else f"static batch {batch_size}")
    return summarize(name, started, max(done), first_token, done, output_tokens)


def in_subprocess(*args: str):
    result = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    sys.stderr.write(
        "".join(
            line + "\n"
            for line in result.stderr.splitlines()
            if not line.startswith(("Converting", "Loading")) and "Warn" not in line
        )
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


SYSTEMS = (
    "dpgate",
    "dpgate-torch",
    "dpgate-old-default",
    "transformers-sequential",
    "transformers-static",
    "dpgate-sweep",
    "transformers-sweep",
)


def run_system(args: argparse.Namespace):
    """One system's runs in this (sub)process: a summary, or for the sweeps a list of them."""
    if args.system.startswith("dpgate"):
        kernels = {"dpgate-torch": "torch", "dpgate-old-default": "old-default"}.get(args.system, "served")
        model = load_dpgate(kernels, args.isa, args.output_tokens)
        if args.system == "dpgate-sweep":
            return [
                {"concurrency": c, **run_dpgate(*model, sweep_requests(c, args.requests), c, args.output_tokens, False)}
                for c in args.concurrencies
            ]
        return run_dpgate(*model, args.requests, CONCURRENCY, args.output_tokens, args.profile)
    model, dtype = load_transformers(args.isa)
    if args.system == "transformers-sweep":
        return [
            {"concurrency": c, **run_transformers(model, dtype, c, c, args.output_tokens)} for c in args.concurrencies
        ]
    batch_size = 1 if args.system == "transformers-sequential" else CONCURRENCY
    return run_transformers(model, dtype, args.requests, batch_size, args.output_tokens)


def concurrency_sweep(args: argparse.Namespace, results: list[dict], sizes: list[str]) -> dict[str, list[dict]]:
    """dpgate served and transformers at each of --concurrencies; the main runs stand for C = 16
    (and transformers' sequential run for C = 1), so only the other concurrencies run again."""
    others = [str(c) for c in args.concurrencies if c != CONCURRENCY]
    sweep = {"dpgate": [], "transformers": []}
    if others:
        sweep["dpgate"] = in_subprocess("--system", "dpgate-sweep", "--concurrencies", *others, *sizes)
    if CONCURRENCY in args.concurrencies:
        sweep["dpgate"].append({"concurrency": CONCURRENCY, **results[0]})
    if not args.no_transformers:
        batched = [c for c in others if c != "1"]
        if batched:
            sweep["transformers"] = in_subprocess("--system", "transformers-sweep", "--concurrencies", *batched, *sizes)
        if 1 in args.concurrencies:
            sweep["transformers"].insert(0, {"concurrency": 1, **results[4]})
        if CONCURRENCY in args.concurrencies:
            sweep["transformers"].append({"concurrency": CONCURRENCY, **results[3]})
    for rows in sweep.values():
        rows.sort(key=lambda row: row["concurrency"])
    print(
        f"\nconcurrency sweep, C in flight (dpgate served: {args.requests / CONCURRENCY:g} waves of C requests; "
        "transformers: one static batch of C)"
    )
    print(f"{'system':<52}{'C':>4}{'reqs':>5}{'out tok/s':>11}{'TTFT p50/p90/p99 ms':>24}{'TPOT p50/p90/p99 ms':>24}")
    for rows in sweep.values():
        for r in rows:
            print(
                f"{r['system']:<52}{r['concurrency']:>4}{r['requests']:>5}{r['output_tokens_per_s']:>11.1f}"
                f"{r['ttft_p50_ms']:>10.0f}/{r['ttft_p90_ms']:.0f}/{r['ttft_p99_ms']:<6.0f}"
                f"{r['tpot_p50_ms']:>10.1f}/{r['tpot_p90_ms']:.1f}/{r['tpot_p99_ms']:<6.1f}"
            )
    return sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--sequential-requests", type=int, default=8)
    parser.add_argument("--profile", action="store_true", help="print a profile of one full-batch decode step")
    parser.add_argument("--isa", choices=["avx512", "avx2", "scalar"], help="cap dpgate's kernel instruction set")
    parser.add_argument("--no-transformers", action="store_true", help="measure dpgate only")
    parser.add_argument(
        "--concurrencies", type=int, nargs="+", help=f"also sweep these numbers in flight (1-{CONCURRENCY})"
    )
    parser.add_argument("--output-tokens", type=int, default=OUTPUT_TOKENS, help="tokens each request generates")
    parser.add_argument("--system", choices=SYSTEMS)
    add_json_argument(parser)
    args = parser.parse_args()
    if args.output_tokens < 2:
        parser.error("--output-tokens must be at least 2 (time per output token needs two tokens)")
    if args.concurrencies and not all(1 <= c <= CONCURRENCY for c in args.concurrencies):
        parser.error(
            f"--concurrencies must each be between 1 and {CONCURRENCY} (the runner is sized for {CONCURRENCY})"
        )
    if args.system is not None:
        print(json.dumps(run_system(args)))
        return

    from machine import describe_machine

    print(
        f"SmolLM2-135M-Instruct: {args.requests} requests x {PROMPT_TOKENS} prompt + {args.output_tokens} output "
        f"tokens, {CONCURRENCY} in flight\n{describe_machine()}"
    )
    isa = ["--isa", args.isa] if args.isa else []
    profile = ["--profile"] if args.profile else []
    tokens = ["--output-tokens", str(args.output_tokens)]
    results = [
        in_subprocess("--system", "dpgate", "--requests", str(args.requests), *tokens, *isa, *profile),
        in_subprocess("--system", "dpgate-torch", "--requests", str(args.requests), *tokens, *profile),
        in_subprocess("--system", "dpgate-old-default", "--requests", str(args.requests), *tokens),
    ]
    if not args.no_transformers:
        results += [
            in_subprocess("--system", "transformers-static", "--requests", str(args.requests), *tokens, *isa),
            in_subprocess(
                "--system", "transformers-sequential", "--requests", str(args.sequential_requests), *tokens, *isa
            ),
        ]
    header = f"{'system':<52}{'reqs':>5}{'out tok/s':>11}{'TTFT p50/p99 ms':>20}{'TPOT p50/p99 ms':>18}{'peak MB':>9}"
    print(header)
    for r in results:
        print(
            f"{r['system']:<52}{r['requests']:>5}{r['output_tokens_per_s']:>11.1f}"
            f"{r['ttft_p50_ms']:>11.0f}/{r['ttft_p99_ms']:<8.0f}{r['tpot_p50_ms']:>9.1f}/{r['tpot_p99_ms']:<8.1f}"
            f"{r['peak_rss_mb']:>9.0f}"
        )
    ours = results[0]["output_tokens_per_s"]
    torch_rate = results[1]["output_tokens_per_s"]
    print(f"batch-invariant / torch kernels (same dtype, same weights): {ours / torch_rate:.2f}x")
    print(f"served / the old default (bf16+int8 on torch's kernels): {ours / results[2]['output_tokens_per_s']:.2f}x")
    for peer in results[3:]:
        print(f"dpgate served / {peer['system']}: {ours / peer['output_tokens_per_s']:.2f}x")
    sweep = None
    if args.concurrencies:
        sizes = ["--requests", str(args.requests), *tokens, *isa]
        sweep = concurrency_sweep(args, results, sizes)
    roles = ["served", "torch-kernels", "old-default", "transformers-static", "transformers-sequential"]
    write_results(
        args.json,
        "throughput",
        {
            "prompt_tokens": PROMPT_TOKENS,
            "output_tokens": args.output_tokens,
            "concurrency": CONCURRENCY,
            "systems": [{"role": role, **r} for role, r in zip(roles, results, strict=False)],
            "sweep": sweep,
        },
    )


if __name__ == "__main__":
    main()
