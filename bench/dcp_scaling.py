"""Decode context parallelism on Gemma 3 270M (4 query heads, 1 KV head): decode step time,
attention time and KV bytes per rank at long contexts, for C = 1 and C = 2, in one run.

Configurations: one process (T = 1), two TP ranks that replicate the KV head (T = 2, C = 1), and
two TP ranks that split its tokens (T = 2, C = 2). For each context length the engine's runner
decodes one sequence whose cache holds that many tokens (the cache is sized for the longest; its
contents do not change the time, so it is not prefilled), in float32 over int8 weights on the
batch-invariant kernels, as served. Attention time is what rank 0 spends in the model's attention
calls (with DCP: the query gather, the shard attention, the exchange and the combine); the other
ranks run the same steps in lockstep. KV bytes per rank count the context's keys and values that
one rank holds.

The single process runs its layers on the module path, as the TP ranks do, not the fused C++
layer it is served with (engines/model/fused.py): inside that layer attention is no Python call
to time, so T = 1 would show none. The two paths give the same bits; bench/step_split.py measures
what the fused layer saves.

    python bench/dcp_scaling.py [--contexts 1024 4096 16384 32768] [--steps 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager

from machine import describe_machine
from results import add_json_argument, write_results

CONFIGURATIONS = ((1, 1), (2, 1), (2, 2))


@contextmanager
def timed_attention(totals: dict[str, float]):
    """Accumulate the time rank 0 spends in attention (the model modules call `attend`), apart for
    the global layers and the sliding-window ones (Gemma 3: 3 of 18 layers are global)."""
    import engines.model.llama as llama

    original = llama.attend

    def attend(*args, sliding_window=None, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, sliding_window=sliding_window, **kwargs)
        finally:
            totals["global" if sliding_window is None else "sliding"] += time.perf_counter() - started

    llama.attend = attend
    try:
        yield
    finally:
        llama.attend = original


def measure(tp: int, dcp: int, contexts: list[int], steps: int) -> list[dict]:
    from engines.config import EngineConfig
    from engines.model.fused import unfuse_decoder_layers
    from engines.model.source import resolve_model
    from engines.runner.model_runner import ChunkInput
    from engines.serving.server import numerics_for
    from engines.serving.startup import start_model

    longest = max(contexts)
    config = EngineConfig(
        model="gemma3-270m", max_model_len=longest, num_kv_blocks=-(-longest // (16 * dcp)) + 2,
        tensor_parallel_size=tp, decode_context_parallel_size=dcp, max_num_seqs=1, max_num_batched_tokens=16,
        allow_oversubscribe=True,
    )  # fmt: skip
    source = resolve_model(config.model)
    model = start_model(config, source, numerics_for(config, source))
    unfuse_decoder_layers(model.loaded.model)  # T = 1 only: TP shards are never fused
    runner = model.runner
    table = range(runner.num_blocks)
    cache = runner.cache
    per_token = cache.keys.shape[0] * cache.keys.shape[1] * cache.keys.shape[3] * cache.keys.element_size() * 2
    rows = []
    try:
        for context in contexts:
            step_times, attention_times = [], []
            for _ in range(steps + 1):  # the first is a warm-up of this depth
                totals = {"global": 0.0, "sliding": 0.0}
                with timed_attention(totals):
                    started = time.perf_counter()
                    runner.execute([ChunkInput([7], context - 1, table)])
                    step_times.append(time.perf_counter() - started)
                attention_times.append(totals)
            rows.append(
                {
                    "context": context,
                    "step_ms": 1e3 * statistics.median(step_times[1:]),
                    "attention_ms": 1e3 * statistics.median(sum(t.values()) for t in attention_times[1:]),
                    "global_ms": 1e3 * statistics.median(t["global"] for t in attention_times[1:]),
                    "sliding_ms": 1e3 * statistics.median(t["sliding"] for t in attention_times[1:]),
                    "kv_mb_per_rank": per_token * context / dcp / 2**20,
                }
            )
    finally:
        model.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--steps", type=int, default=5)
    add_json_argument(parser)
    args = parser.parse_args()
    print(f"Gemma 3 270M, one sequence decoding at each context length, median of {args.steps} steps")
    print(describe_machine())
    results = {config: measure(*config, args.contexts, args.steps) for config in CONFIGURATIONS}
    print(f"{'context':>8} {'config':>9} {'step ms':>9} {'attention ms':>13} {'global':>8} {'sliding':>8} "
          f"{'KV MB/rank':>11}")  # fmt: skip
    for i, context in enumerate(args.contexts):
        for (tp, dcp), rows in results.items():
            row = rows[i]
            print(f"{context:>8} {f'T{tp} C{dcp}':>9} {row['step_ms']:>9.1f} {row['attention_ms']:>13.1f} "
                  f"{row['global_ms']:>8.1f} {row['sliding_ms']:>8.1f} {row['kv_mb_per_rank']:>11.1f}")  # fmt: skip
    print("ratios, T2 C2 against T2 C1 (and against T1 C1):")
    for i, context in enumerate(args.contexts):
        dcp, replicated, single = results[(2, 2)][i], results[(2, 1)][i], results[(1, 1)][i]
        attention = dcp["attention_ms"] / replicated["attention_ms"], dcp["attention_ms"] / single["attention_ms"]
        step = dcp["step_ms"] / replicated["step_ms"], dcp["step_ms"] / single["step_ms"]
        global_layers = dcp["global_ms"] / replicated["global_ms"]
        kv = dcp["kv_mb_per_rank"] / replicated["kv_mb_per_rank"]
        print(
            f"  {context:>6}: attention {attention[0]:.2f}x ({attention[1]:.2f}x), global layers' attention "
            f"{global_layers:.2f}x, step {step[0]:.2f}x ({step[1]:.2f}x), KV bytes per rank {kv:.2f}x"
        )
    configurations = [{"tp": tp, "dcp": dcp, "rows": rows} for (tp, dcp), rows in results.items()]
    write_results(
        args.json, "dcp_scaling", {"model": "gemma3-270m", "steps": args.steps, "configurations": configurations}
    )


if __name__ == "__main__":
    main()
