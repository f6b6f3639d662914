"""A/B of the served weights on the real engine: --quantization gguf against int8, same process.

SmolLM2-135M-Instruct on dpgate's batch-invariant kernels, float32 activations, loaded once per
weight storage; then, alternating between the two models each round so a busy machine's noise
falls on both alike: one 256-token prompt's prefill (tokens/s), batch-1 greedy decode (tokens/s)
and 16 concurrent sequences of 256 + `--output` tokens through the engine loop (output tokens/s,
end to end). The best round of each is printed, with the CPU.

    python bench/quant_serving.py [--rounds 3] [--output 64] [--isa avx2] [--threads 2]
"""

from __future__ import annotations

import argparse
import random
import time

import torch

PROMPT_TOKENS, CONCURRENCY = 256, 16


def load(quantization: str, isa: str | None):
    from machine import engine_numerics

    from engines.model.source import resolve_model
    from engines.runner.loader import load_for_serving

    return load_for_serving(
        resolve_model("smollm2-135m-instruct"), engine_numerics(True, isa, quantization=quantization)
    )


def prompts(count: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(100, 49152) for _ in range(PROMPT_TOKENS)] for _ in range(count)]


def prefill_rate(loaded) -> float:
    from engines.runner.model_runner import ModelRunner

    runner = ModelRunner(loaded, PROMPT_TOKENS + 8)
    start = time.perf_counter()
    runner.forward(prompts(1)[0], 0)
    return PROMPT_TOKENS / (time.perf_counter() - start)


def serve(loaded, count: int, output: int) -> float:
    """Output tokens/s of `count` concurrent greedy requests of 256 + `output` tokens, end to end."""
    from dpgate.v1 import generate_pb2 as pb
    from engines.engine import LLMEngine
    from engines.runner.model_runner import ModelRunner
    from engines.scheduling.scheduler import SchedulerConfig
    from engines.serving.request_builder import ModelLimits, build_sequence

    max_len = PROMPT_TOKENS + output
    runner = ModelRunner(loaded, max_len, num_blocks=count * max_len // 16 + 16, block_size=16)
    engine = LLMEngine(runner, SchedulerConfig(max_num_seqs=count, max_num_batched_tokens=512))
    limits = ModelLimits("m", loaded.config.vocab_size, max_len, loaded.tokenizer.eos_token_ids)
    start = time.perf_counter()
    for i, ids in enumerate(prompts(count)):
        request = pb.GenerateRequest(
            request_id=str(i),
            token_ids=pb.TokenIds(ids=ids),
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingCriteria(max_tokens=output, ignore_eos=True),
        )
        engine.add(build_sequence(request, limits, loaded.tokenizer.tokenizer))
    while engine.has_work:
        engine.step()
    return count * output / (time.perf_counter() - start)


def decode_rate(loaded, output: int) -> float:
    """Batch-1 decode tokens/s after a short prompt (the prefill excluded)."""
    from engines.runner.model_runner import ModelRunner

    runner = ModelRunner(loaded, 16 + output + 1)
    ids = prompts(1)[0][:16]
    logits = runner.forward(ids, 0)
    start = time.perf_counter()
    for step in range(output):
        logits = runner.forward([int(logits.argmax())], len(ids) + step)
    return output / (time.perf_counter() - start)


def main() -> None:
    from machine import describe_machine

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--isa", choices=["avx512", "avx2", "scalar"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(describe_machine())
    models = {q: load(q, args.isa) for q in ("int8", "gguf")}
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):
        for q, loaded in models.items():
            for figure, rate in (
                ("prefill 256 tok/s", prefill_rate(loaded)),
                ("batch-1 decode tok/s", decode_rate(loaded, args.output)),
                (f"16 x (256 + {args.output}) output tok/s", serve(loaded, CONCURRENCY, args.output)),
            ):
                best[figure, q] = max(best.get((figure, q), 0.0), rate)
    print(f"{'best of ' + str(args.rounds) + ' rounds':<36}{'int8':>10}{'gguf':>10}{'gguf/int8':>11}")
    for figure in dict.fromkeys(f for f, _ in best):
        a, b = best[figure, "int8"], best[figure, "gguf"]
        print(f"{figure:<36}{a:>10.1f}{b:>10.1f}{b / a:>10.2f}x")


if __name__ == "__main__":
    main()
