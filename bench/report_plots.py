"""The report's PNG figures, one function per plot, each drawn from one benchmark's JSON and titled
with the CPU it was measured on (a figure without its machine invites the wrong comparison)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a build machine

import matplotlib.pyplot as plt
from report_ratios import cpu_label

PERCENTILES = (("p50", "-"), ("p90", "--"), ("p99", ":"))


def _save(figure, path: Path, title: str, record: dict) -> None:
    figure.suptitle(f"{title}\n{cpu_label(record['machine'])}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _family(key: str, rows: list[dict]) -> str:
    """A sweep's legend name: dpgate's configuration, or transformers' dtype and batching (its C = 1
    point is the sequential run, named as such)."""
    if key == "transformers":
        return rows[-1]["system"].split(" static batch")[0].split(" sequential")[0] + ", static batch of C"
    return rows[0]["system"]


def _concurrency_axis(axes, concurrencies: list[int]) -> None:
    axes.set_xscale("log", base=2)
    axes.set_xticks(concurrencies, [str(c) for c in concurrencies])
    axes.minorticks_off()
    axes.set_xlabel("requests in flight")
    axes.grid(alpha=0.3)


def throughput_vs_concurrency(record: dict, path: Path) -> str:
    results = record["results"]
    figure, axes = plt.subplots(figsize=(7, 4.2))
    concurrencies = set()
    for key, rows in results["sweep"].items():
        if rows:
            c = [row["concurrency"] for row in rows]
            concurrencies.update(c)
            axes.plot(c, [row["output_tokens_per_s"] for row in rows], marker="o", label=_family(key, rows))
    _concurrency_axis(axes, sorted(concurrencies))
    axes.set_ylabel("output tokens/s")
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=8)
    shape = f"{results['prompt_tokens']} prompt + {results['output_tokens']} output tokens a request"
    _save(figure, path, f"Serving throughput vs concurrency, SmolLM2-135M ({shape})", record)
    return f"Output tokens/s against the number of requests in flight ({shape})."


def latency_percentiles(record: dict, path: Path) -> str:
    sweep = record["results"]["sweep"]
    figure, (ttft, tpot) = plt.subplots(1, 2, figsize=(10, 4.2))
    concurrencies = set()
    for color, (key, rows) in zip(("tab:blue", "tab:orange"), sweep.items(), strict=True):
        if not rows:
            continue
        c = [row["concurrency"] for row in rows]
        concurrencies.update(c)
        for q, style in PERCENTILES:
            label = f"{_family(key, rows)} {q}"
            ttft.plot(c, [row[f"ttft_{q}_ms"] for row in rows], style, color=color, marker="o", label=label)
            tpot.plot(c, [row[f"tpot_{q}_ms"] for row in rows], style, color=color, marker="o", label=label)
    for axes, name in ((ttft, "time to first token (ms)"), (tpot, "time per output token (ms)")):
        _concurrency_axis(axes, sorted(concurrencies))
        axes.set_ylabel(name)
        axes.set_ylim(bottom=0)
    ttft.legend(fontsize=7)
    _save(figure, path, "TTFT and TPOT percentiles vs concurrency, SmolLM2-135M", record)
    return "Time to first token and time per output token, p50 / p90 / p99, at each concurrency."


def dcp_step_time(record: dict, path: Path) -> str:
    figure, (step, attention) = plt.subplots(1, 2, figsize=(10, 4.2))
    for config in record["results"]["configurations"]:
        rows = config["rows"]
        label = f"T{config['tp']} C{config['dcp']}"
        contexts = [row["context"] for row in rows]
        step.plot(contexts, [row["step_ms"] for row in rows], marker="o", label=label)
        attention.plot(contexts, [row["attention_ms"] for row in rows], marker="o", label=label)
    contexts = sorted({row["context"] for config in record["results"]["configurations"] for row in config["rows"]})
    for axes, name in ((step, "decode step (ms)"), (attention, "attention, rank 0 (ms)")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(contexts, [f"{c:,}" for c in contexts])
        axes.minorticks_off()
        axes.set_ylim(bottom=0)
        axes.set_xlabel("context length (tokens)")
        axes.set_ylabel(name)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    _save(figure, path, "Decode context parallelism: step time vs context length, Gemma 3 270M", record)
    return "Median decode step and attention time of one sequence at each context length, for T1 C1, T2 C1, T2 C2."


def gateway_added_latency(record: dict, path: Path) -> str:
    targets = {t["role"]: t for t in record["results"]["targets"]}
    direct = {s["scenario"]: s for s in targets["direct"]["scenarios"]}
    scenarios = [name for name, s in direct.items() if s["p50_ms"]]
    figure, axes = plt.subplots(figsize=(8, 4.2))
    colors = {"peer": "tab:orange", "envoy": "tab:green", "dpgate": "tab:blue"}
    bars = [(role, q) for role in colors if role in targets for q in ("p50", "p99")]
    width = 0.8 / len(bars)
    for offset, (role, q) in enumerate(bars):
        by_name = {s["scenario"]: s for s in targets[role]["scenarios"]}
        added = [by_name[name][f"{q}_ms"] - direct[name][f"{q}_ms"] for name in scenarios]
        positions = [i + (offset - (len(bars) - 1) / 2) * width for i in range(len(scenarios))]
        color = colors[role]
        axes.bar(positions, added, width, color=color, alpha=0.45 if q == "p99" else 1.0,
                 label=f"{targets[role]['name']} {q}")  # fmt: skip
    axes.axhline(0, color="black", linewidth=0.6)
    axes.set_xticks(range(len(scenarios)), scenarios)
    axes.set_ylabel("added latency over a direct call (ms)")
    axes.grid(alpha=0.3, axis="y")
    axes.legend(fontsize=8)
    tokens = record["results"]["tokens"]
    _save(figure, path, f"Gateway added latency, synthetic engine ({tokens} tokens a call)", record)
    return "Latency a proxy adds to the same call made directly to the engine, at concurrency 1 (p50 and p99)."


def grammar_overhead(record: dict, path: Path) -> str:
    results = record["results"]
    conditions = results["conditions"]
    figure, (steps, rates) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    steps.boxplot([c["step_ms"] for c in conditions.values()], tick_labels=list(conditions), showfliers=False)
    steps.set_ylabel(f"full-batch decode step (ms), batch {results['batch']}")
    steps.grid(alpha=0.3, axis="y")
    rates.bar(list(conditions), [c["tokens_per_s"] for c in conditions.values()], color=["tab:blue", "tab:green"])
    rates.set_ylabel("decode tokens/s")
    rates.set_title(f"json schema / unconstrained = {results['ratio']:.3f}x", fontsize=9)
    rates.grid(alpha=0.3, axis="y")
    _save(figure, path, "Grammar-masked sampling overhead, SmolLM2-135M", record)
    return "Decode step times (box: quartiles, whiskers: 1.5 IQR) and tokens/s with and without a JSON schema."


# (benchmark, file name, title in the page, draw)
PLOTS = (
    ("throughput", "throughput_vs_concurrency.png", "Throughput vs concurrency", throughput_vs_concurrency),
    ("throughput", "latency_percentiles.png", "TTFT and TPOT percentiles", latency_percentiles),
    ("dcp_scaling", "dcp_step_time.png", "DCP step time vs context length", dcp_step_time),
    ("gateway_overhead", "gateway_added_latency.png", "Gateway added latency", gateway_added_latency),
    ("grammar_overhead", "grammar_overhead.png", "Grammar overhead", grammar_overhead),
)
