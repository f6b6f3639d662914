"""What grammar-masked sampling costs: decode tokens/s at batch 8 with and without a JSON schema,
in one run, on the served default (batch-invariant kernels; float32 activations, int-dot over the GGUF's blocks).

8 chat requests decode through the engine core (`LLMEngine`, the loop behind the gRPC server),
greedy: unconstrained with eos ignored, and constrained by a JSON schema whose one string must be
at least 600 characters long (so every request is still decoding at the end), 128 tokens each.
Two engines, one per condition, take steps in turn, so a burst of load on a shared machine falls
on both alike; decode tokens/s is 8 / the median time of the steps in which all 8 requests
decode (no prefill in the step). Also printed: the mask time per step (filling 8 bitmask rows
and applying them), compile time cold vs cached, and unconstrained decode while a slow schema
compiles on the compiler's thread. Target: constrained >= 0.95x unconstrained.

    python bench/grammar_overhead.py [--rounds 3] [--tokens 128] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from results import add_json_argument

BATCH = 8
STORY = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40}, "story": {"type": "string", "minLength": 600}},
    "required": ["title", "story"],
}
# A slow schema: 24 objects of 8 patterned strings (16 KB; seconds to compile on a 2-core machine).
SLOW = {
    "type": "object",
    "properties": {
        f"k{i}": {
            "type": "object",
            "properties": {f"j{j}": {"type": "string", "pattern": "[a-z]{3,9}@[a-z]+\\.(com|org)"} for j in range(8)},
            "required": [f"j{j}" for j in range(8)],
        }
        for i in range(24)
    },
}
PROMPTS = [
    "Write a long story about a lighthouse keeper.",
    "Write a long story about a dragon who bakes bread.",
    "Write a long story about a lost robot.",
    "Write a long story about two rival chess players.",
    "Write a long story about a city under the sea.",
    "Write a long story about a time-travelling cat.",
    "Write a long story about a haunted library.",
    "Write a long story about the last tree on Mars.",
]


def is_full_decode(engine) -> bool:
    running = engine.scheduler.running
    return len(running) == BATCH and all(s.num_tokens - s.num_computed_tokens == 1 for s in running)


def timed_step(engine) -> tuple[float, float] | None:
    """(seconds, mask seconds) of one step if all 8 requests decoded in it, else None."""
    full = is_full_decode(engine)
    masked_before = engine.mask_seconds
    started = time.perf_counter()
    outputs = engine.step()
    elapsed = time.perf_counter() - started
    return (elapsed, engine.mask_seconds - masked_before) if full and len(outputs) == BATCH else None


def interleaved(engines: dict) -> dict[str, list[tuple[float, float]]]:
    """Step the engines in turn, one step each, until all are done: a burst of load on a shared
    machine falls on both alike. Returns each one's full-batch decode steps."""
    times = {name: [] for name in engines}
    while any(engine.has_work for engine in engines.values()):
        for name, engine in engines.items():
            if engine.has_work and (step := timed_step(engine)) is not None:
                times[name].append(step)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    add_json_argument(parser)
    args = parser.parse_args()

    from machine import describe_machine, engine_numerics
    from results import write_results

    from dpgate.v1 import generate_pb2 as pb
    from engines.engine import LLMEngine
    from engines.grammar.compiler import GrammarCompiler
    from engines.grammar.matcher import RequestGrammar
    from engines.grammar.spec import json_schema_spec
    from engines.model.source import resolve_model
    from engines.runner.loader import load_for_serving
    from engines.runner.model_runner import ModelRunner
    from engines.scheduling.scheduler import SchedulerConfig
    from engines.serving.request_builder import ModelLimits, build_sequence

    numerics = engine_numerics()
    loaded = load_for_serving(resolve_model("smollm2-135m-instruct"), numerics)
    tokenizer, vocab_size = loaded.tokenizer, loaded.config.vocab_size
    limits = ModelLimits("m", vocab_size, 2048, tokenizer.eos_token_ids)
    print(describe_machine())
    print(f"engine: {numerics.describe()}; SmolLM2-135M-Instruct, batch {BATCH}, {args.tokens} tokens a request")

    compiler = GrammarCompiler(tokenizer.tokenizer, vocab_size, tokenizer.eos_token_ids)
    started = time.perf_counter()
    compiler.prepare()
    vocabulary_s = time.perf_counter() - started
    compile_times = {}
    for name, schema in (("story schema", STORY), ("slow schema", SLOW)):
        spec = json_schema_spec(json.dumps(schema))
        started = time.perf_counter()
        compiler.submit(spec).result()
        cold = time.perf_counter() - started
        started = time.perf_counter()
        compiler.submit(spec).result()
        compile_times[name] = (cold, time.perf_counter() - started, len(spec.text))
    story = compiler.submit(json_schema_spec(json.dumps(STORY))).result()

    def requests(constrained: bool):
        seqs = []
        for i, prompt in enumerate(PROMPTS):
            wire = pb.GenerateRequest(
                request_id=f"r{i}",
                text=f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n",
                sampling=pb.SamplingParams(temperature=0.0),
                stopping=pb.StoppingCriteria(max_tokens=args.tokens, ignore_eos=not constrained),
            )
            seq = build_sequence(wire, limits, tokenizer.tokenizer)
            if constrained:
                seq.grammar = RequestGrammar(story, seq.stop_token_ids, vocab_size)
            seqs.append(seq)
        return seqs

    def engine():
        runner = ModelRunner(loaded, 2048, 512, 16)
        return LLMEngine(runner, SchedulerConfig(max_num_seqs=BATCH))

    def loaded_engine(constrained: bool):
        fresh = engine()
        for seq in requests(constrained):
            fresh.add(seq)
        return fresh

    interleaved({"warm-up": loaded_engine(False)})  # first touch of buffers and caches
    steps = {"unconstrained": [], "json schema": []}
    for _ in range(args.rounds):
        for name, times in interleaved(
            {"unconstrained": loaded_engine(False), "json schema": loaded_engine(True)}
        ).items():
            steps[name] += times

    slow_compiler = GrammarCompiler(tokenizer.tokenizer, vocab_size, tokenizer.eos_token_ids)
    slow_compiler.prepare()
    # Other patterns: xgrammar keeps per-rule results across compilers, so SLOW itself would be warm.
    uncached = json.dumps(SLOW).replace("(com|org)", "(net|edu)")
    compiling = slow_compiler.submit(json_schema_spec(uncached))
    beside = loaded_engine(False)
    during, after = [], []
    while beside.has_work:
        busy = not compiling.done()
        if (step := timed_step(beside)) is not None:
            (during if busy else after).append(step[0])
    compiling.result()

    base = statistics.median(t for t, _ in steps["unconstrained"])
    print(
        f"\ndecode tokens/s at batch {BATCH}: {BATCH} / median step time, {args.rounds} rounds, engines stepped in turn"
    )
    for name, times in steps.items():
        median = statistics.median(t for t, _ in times)
        figures = f"{BATCH / median:7.1f}  {base / median:5.3f}x"
        print(f"  {name:<14} {figures}  ({len(times)} steps, median {1e3 * median:.1f} ms)")
    ratio = base / statistics.median(t for t, _ in steps["json schema"])
    print(f"  target: json schema >= 0.95x unconstrained; measured {ratio:.3f}x")
    mask = statistics.median(m for _, m in steps["json schema"])
    print(f"mask time per step ({BATCH} rows filled into one bitmask and applied), median: {1e3 * mask:.3f} ms")
    print(f"vocabulary for xgrammar (once per engine, on the first grammar): {1e3 * vocabulary_s:.0f} ms")
    for name, (cold, cached, size) in compile_times.items():
        print(f"compile {name} ({size} bytes): cold {1e3 * cold:.1f} ms, cached {1e6 * cached:.1f} us")
    if not during:
        print("the slow schema compiled before the batch's first full decode step")
    elif after:
        slowdown = statistics.median(after) / statistics.median(during)
        rate_during, rate_after = BATCH / statistics.median(during), BATCH / statistics.median(after)
        print(
            f"unconstrained decode while the slow schema compiles on its thread: {rate_during:.1f} tokens/s"
            f" over {len(during)} steps, {slowdown:.3f}x the {rate_after:.1f} after it"
        )
    compiler.shutdown()
    slow_compiler.shutdown()
    conditions = {
        name: {
            "tokens_per_s": BATCH / statistics.median(t for t, _ in times),
            "step_ms": [1e3 * t for t, _ in times],
            "mask_ms": [1e3 * m for _, m in times],
        }
        for name, times in steps.items()
    }
    compiles = [
        {"schema": name, "bytes": size, "cold_ms": 1e3 * cold, "cached_ms": 1e3 * cached}
        for name, (cold, cached, size) in compile_times.items()
    ]
    results = {
        "batch": BATCH,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "conditions": conditions,
        "ratio": ratio,
        "target_ratio": 0.95,
        "vocabulary_ms": 1e3 * vocabulary_s,
        "compile": compiles,
        "beside_slow_compile": {
            "during_tokens_per_s": BATCH / statistics.median(during) if during else None,
            "after_tokens_per_s": BATCH / statistics.median(after) if after else None,
            "during_steps": len(during),
        },
    }
    write_results(args.json, "grammar_overhead", results)


if __name__ == "__main__":
    main()
