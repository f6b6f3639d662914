"""Single-stream decode speed: the dpgate engine against transformers on the same model, same run.

Both sides decode greedily from the same prompt for the same number of tokens. Decode speed is
(tokens - 1) / (time from the first generated token to the last), so prompt processing and
start-up do not count. dpgate is measured as a user gets it, `dpgate engine` streaming over gRPC
(bench/served_vs_core.py), and through its core (`LLMEngine.step` in this process, the ceiling);
transformers through `generate`, timed by a logits processor.
dpgate runs as served (batch-invariant kernels, float32 activations, int-dot over the GGUF's
blocks), on torch's kernels with the same dtype over int8 weights (what invariance costs at batch
1; torch has no int-dot), and as it
was served before the kernels (torch, bfloat16 + int8). The CPU and its flags are printed.

    python bench/engine_vs_transformers.py [--tokens 128] [--repeats 3] [--isa avx2] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from machine import describe_machine, engine_numerics
from results import add_json_argument, write_results
from served_vs_core import ServedEngine
from step_clock import timed_greedy_generate

from dpgate.v1 import generate_pb2 as pb
from engines.engine import LLMEngine
from engines.model.numerics import Numerics
from engines.model.source import resolve_model
from engines.runner.loader import load_for_serving
from engines.runner.model_runner import ModelRunner
from engines.serving.request_builder import ModelLimits, build_sequence

PROMPT = "The history of the printing press begins"


def dpgate_decode_rate(numerics: Numerics, num_tokens: int) -> float:
    loaded = load_for_serving(resolve_model("smollm2-135m-instruct"), numerics)
    engine = LLMEngine(ModelRunner(loaded, 1024))
    limits = ModelLimits("m", loaded.config.vocab_size, 1024, loaded.tokenizer.eos_token_ids)
    request = pb.GenerateRequest(
        text=PROMPT,
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_tokens=num_tokens, ignore_eos=True),
    )
    engine.add(build_sequence(request, limits, loaded.tokenizer.tokenizer))
    engine.step()  # prefill and the first token
    started = time.perf_counter()
    while engine.has_work:
        engine.step()
    return (num_tokens - 1) / (time.perf_counter() - started)


def transformers_decode_rate(dtype: torch.dtype, num_tokens: int) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model("smollm2-135m-instruct").path
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    clock = timed_greedy_generate(model, ids, num_tokens)
    return (len(clock.times) - 1) / (clock.times[-1] - clock.times[0])


def best_of(repeats: int, measure, *args) -> float:
    return max(measure(*args) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--isa", choices=["avx512", "avx2", "scalar"], help="cap dpgate's kernel instruction set")
    add_json_argument(parser)
    args = parser.parse_args()
    print(f"SmolLM2-135M-Instruct, single stream, {args.tokens} greedy tokens, best of {args.repeats}")
    print(describe_machine())
    served = engine_numerics(True, args.isa)
    configurations = {}
    if args.isa is None:  # `dpgate engine` has no ISA cap: its figure is this CPU's
        configurations["dpgate as served: dpgate engine over gRPC"] = (None, None)  # measured by the engine below
    configurations |= {
        f"dpgate served: {served.dtype}+{served.quantization} {served.kernels}": (dpgate_decode_rate, served),
        f"dpgate {served.dtype}+int8 torch kernels": (dpgate_decode_rate, engine_numerics(False, dtype=served.dtype)),
        "dpgate bf16+int8 torch (the old default)": (dpgate_decode_rate, engine_numerics(False, dtype="bfloat16")),
        "transformers bf16": (transformers_decode_rate, torch.bfloat16),
        "transformers fp32": (transformers_decode_rate, torch.float32),
    }
    rates = {}
    with ServedEngine() if args.isa is None else contextlib.nullcontext() as served_engine:
        for name, (measure, setting) in configurations.items():
            if measure is None:
                rates[name] = max(served_engine.decode_rate(args.tokens) for _ in range(args.repeats))
            else:
                rates[name] = best_of(args.repeats, measure, setting, args.tokens)
            print(f"  {name:<52} {rates[name]:7.1f} tok/s")
    roles = ["served-grpc"] * (args.isa is None) + ["served", "torch-kernels", "old-default", "transformers-bf16",
                                                    "transformers-fp32"]  # fmt: skip
    by_role = dict(zip(roles, configurations, strict=True))
    user = by_role.get("served-grpc", by_role["served"])
    print("ratios:")
    print(f"  batch-invariant / torch kernels (same dtype, same weights): "
          f"{rates[by_role['served']] / rates[by_role['torch-kernels']]:.2f}x")  # fmt: skip
    if "served-grpc" in by_role:
        print(f"  served over gRPC / its core in-process: {rates[user] / rates[by_role['served']]:.2f}x")
    print(f"  served / transformers bf16: {rates[user] / rates[by_role['transformers-bf16']]:.2f}x")
    print(f"  served / transformers fp32: {rates[user] / rates[by_role['transformers-fp32']]:.2f}x")
    configurations = [{"role": role, "name": name, "tokens_per_s": rates[name]} for role, name in by_role.items()]
    results = {"tokens": args.tokens, "repeats": args.repeats, "isa": args.isa, "configurations": configurations}
    write_results(args.json, "engine_vs_transformers", results)


if __name__ == "__main__":
    main()
