"""Where a decode step's time goes: matmul kernels, attention, other ops, and Python around them.

Builds the served default engine (or `--quantization`/`--isa` as `dpgate engine` would), prefills
`--batch` sequences of 256 tokens, then runs `--steps` decode steps of the whole batch through
`LLMEngine.step()`: once bare, for the step's CPU time, and once with every dispatched operator
timed by the thread's CPU clock (`OpClock`), sorted into matmuls (dpgate::linear, aten::mm and
kin), attention (dpgate::attention, SDPA, index_copy_ into the cache) and everything else. The
served default runs each decoder layer as one C++ call (engines/model/fused.py), whose kernels
are no torch operators: its own phase clock (`torch.ops.dpgate.layer_clock`) splits them the same
way. `--modules` runs the layers as torch modules instead, the split before the fusion.
Python is the bare step's CPU time minus the operators': what the step spends outside any
operator (scheduler, input building, module calls, argument parsing, sampling loops). What
timing a call costs by itself is measured on a view and taken off every call, so views count
as free and Python is if anything over-counted by about a microsecond an operator.

CPU clocks, not wall clocks, because the machines this runs on are shared: wall times mostly
measure the other work. `--threads 1` (the default) keeps each operator's work on the calling
thread, where its clock can see it, and keeps OpenMP from waiting on preempted threads.

    python bench/step_split.py [--batch 1 16] [--steps 32] [--quantization int8] [--isa avx2] [--modules]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode

PROMPT_TOKENS = 256
MATMUL_OPS = frozenset(
    {
        "dpgate::linear",
        "dpgate::quant_linear",
        "dpgate::int_linear",
        "aten::linear",
        "aten::mm",
        "aten::addmm",
        "aten::matmul",
    }
)
ATTENTION_OPS = frozenset(
    {"dpgate::attention", "aten::scaled_dot_product_attention", "aten::index_copy_", "aten::bmm", "aten::softmax"}
)


def category(name: str) -> str:
    if name in MATMUL_OPS:
        return "matmul"
    if name in ATTENTION_OPS:
        return "attention"
    return "other ops"


def build_engine(batch: int, quantization: str, isa: str | None, max_new: int, fused: bool = True):
    from machine import engine_numerics

    from engines.engine import LLMEngine
    from engines.model.source import resolve_model
    from engines.runner.loader import load_for_serving
    from engines.runner.model_runner import ModelRunner
    from engines.scheduling.scheduler import SchedulerConfig

    numerics = engine_numerics(True, isa, quantization=quantization)
    loaded = load_for_serving(resolve_model("smollm2-135m-instruct"), numerics)
    max_len = PROMPT_TOKENS + max_new + 8
    if not fused:
        from engines.model.fused import unfuse_decoder_layers

        unfuse_decoder_layers(loaded.model)
    runner = ModelRunner(loaded, max_len, num_blocks=batch * max_len // 16 + 16, block_size=16)
    runner.warm_up(batch, 512)
    engine = LLMEngine(runner, SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=512))
    from engines.serving.startup import freeze_startup_heap

    freeze_startup_heap()  # as the engine server does once started
    return engine, loaded


def add_requests(engine, loaded, batch: int, max_new: int) -> None:
    from dpgate.v1 import generate_pb2 as pb
    from engines.serving.request_builder import ModelLimits, build_sequence

    limits = ModelLimits("m", loaded.config.vocab_size, PROMPT_TOKENS + max_new + 8, loaded.tokenizer.eos_token_ids)
    rng = random.Random(0)
    for i in range(batch):
        request = pb.GenerateRequest(
            request_id=str(i),
            token_ids=pb.TokenIds(ids=[rng.randrange(100, 49152) for _ in range(PROMPT_TOKENS)]),
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingCriteria(max_tokens=max_new, ignore_eos=True),
        )
        engine.add(build_sequence(request, limits, loaded.tokenizer.tokenizer))


def decode_steps(engine, batch: int, steps: int) -> tuple[float, float]:
    """Wall and CPU seconds per decode step of the full batch (prefill steps excluded)."""
    while engine.num_running < batch or engine.scheduler.waiting or engine.last_step.num_prompt_tokens:
        engine.step()
    started, started_cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - started) / steps, (time.process_time() - started_cpu) / steps


class OpClock(TorchDispatchMode):
    """Times every operator the step dispatches with the thread's CPU clock (torch runs one
    thread here, so an operator's work is this thread's): unlike the profiler's wall times, not
    inflated by the OS running other work in between. Operators inside an operator are not
    dispatched to the mode again, so nothing is counted twice."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.calls = 0

    def floor(self) -> float:
        """What timing one call costs by itself (the clock reads, the mode's Python), measured on
        a view, an operator that does next to nothing: subtracted from every call's time."""
        import torch

        x = torch.zeros(4)
        with self:
            for _ in range(200):
                x.view(-1)
        floor = self.seconds.pop("aten::view") / 200
        self.counts.clear()
        self.calls = 0
        return floor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        started = time.thread_time()
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        self.seconds[name] += time.thread_time() - started
        self.counts[name] += 1
        self.calls += 1
        return out


def measure(batch: int, steps: int, quantization: str, isa: str | None, fused: bool = True) -> dict:
    import torch

    engine, loaded = build_engine(batch, quantization, isa, 2 * steps + 8, fused)
    add_requests(engine, loaded, batch, 2 * steps + 8)
    _, cpu = decode_steps(engine, batch, steps)
    clock = OpClock()
    floor = clock.floor()
    torch.ops.dpgate.layer_clock(True)
    with clock:
        for _ in range(steps):
            engine.step()
    matmul, attention, norms, other, whole = (seconds / steps for seconds in torch.ops.dpgate.layer_clock(False))
    top = {name: max(0.0, seconds - floor * clock.counts[name]) / steps for name, seconds in clock.seconds.items()}
    split = dict.fromkeys(("matmul", "attention", "other ops"), 0.0)
    for name, seconds in top.items():
        split[category(name)] += seconds
    # Inside fused decoder layers (engines/model/fused.py) the kernels are not torch operators:
    # the layer's own clock splits them, and its whole time is no Python's.
    split["matmul"] += matmul
    split["attention"] += attention
    split["other ops"] += whole - matmul - attention
    split["python"] = max(0.0, cpu - sum(split.values()))
    if whole:
        top["fused layers: norms"] = norms
        top["fused layers: rotary, cache, residuals, activation"] = other
    return {
        "batch": batch,
        "fused_layers": fused,
        "step_ms": 1e3 * cpu,
        "split_ms": {k: 1e3 * v for k, v in split.items()},
        "top_ops_ms": {k: 1e3 * v for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:12]},
        "num_ops_per_step": clock.calls / steps,
        "timing_floor_us": 1e6 * floor,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--isa", choices=["avx512", "avx2", "scalar"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU times are meaningful)")
    parser.add_argument("--modules", action="store_true", help="layers as torch modules (the before)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from machine import describe_machine

    print(describe_machine())
    results = []
    for batch in args.batch:
        r = measure(batch, args.steps, args.quantization, args.isa, fused=not args.modules)
        results.append(r)
        split = ", ".join(f"{k} {v:.2f}" for k, v in r["split_ms"].items())
        step = f"batch {batch:>2}: {r['step_ms']:.2f} ms/step"
        ops = f"{r['num_ops_per_step']:.0f} ops/step, {r['timing_floor_us']:.1f} us timing cost taken off each"
        print(f"{step} ({split} ms, CPU time); {ops}")
        for name, ms in r["top_ops_ms"].items():
            print(f"    {name:<40}{ms:8.3f} ms")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "step_split", "results": results}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
