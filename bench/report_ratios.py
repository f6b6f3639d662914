"""The rows of the report's ratio table, one function per benchmark's JSON (bench/results.py).

A row compares dpgate with the peer the benchmark runs beside it, on the same machine and in the
same run: transformers for the engine, a bare grpc.aio relay for the gateway, llama.cpp on the
same GGUF, and for grammar masks and DCP the run without them. The ratio is always dpgate / peer;
`better` says which way is good, since a latency ratio under 1 is a win and a rate ratio under 1 a
loss.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Row:
    figure: str
    dpgate: float
    peer: str
    peer_value: float
    unit: str
    better: str  # "higher" or "lower"
    cpu: str

    @property
    def ratio(self) -> float:
        return self.dpgate / self.peer_value if self.peer_value else float("nan")


def cpu_label(machine: dict | str | None) -> str:
    """e.g. 'AMD EPYC (AVX2, FMA, AVX-512, AVX512-BF16), 2 cores', from a bench/results.py machine
    record or a describe_machine() line (what a bench written elsewhere may store instead)."""
    if isinstance(machine, dict):
        text, cores = machine.get("cpu") or machine.get("description") or "", machine.get("cores")
    else:
        text, cores = machine or "", None
    text = text.removeprefix("CPU: ").split(";")[0].strip()
    if cores is None and (match := re.search(r"(\d+) cores", machine if isinstance(machine, str) else "")):
        cores = int(match.group(1))
    model, _, flags = text.partition(" (")
    kept = [flag.removesuffix(" yes") for flag in flags.rstrip(")").split(", ") if flag.endswith(" yes")]
    label = model or "unknown CPU"
    if kept:
        label += f" ({', '.join(kept)})"
    return label + (f", {cores} cores" if cores else "")


def _by_role(items: list[dict]) -> dict[str, dict]:
    return {item["role"]: item for item in items}


def throughput_rows(record: dict) -> list[Row]:
    results, cpu = record["results"], cpu_label(record["machine"])
    systems = _by_role(results["systems"])
    served = systems["served"]
    shape = f"{served['requests']} requests x {results['prompt_tokens']}+{results['output_tokens']} tokens"
    rows = []
    for role, setting in (
        ("transformers-static", "in static batches of 16"),
        ("transformers-sequential", "one at a time"),
    ):
        if role in systems:
            peer = systems[role]
            rows.append(
                Row(
                    f"serving throughput ({shape}, 16 in flight; the peer {setting})",
                    served["output_tokens_per_s"],
                    peer["system"],
                    peer["output_tokens_per_s"],
                    "output tok/s",
                    "higher",
                    cpu,
                )
            )
    return rows


def engine_rows(record: dict) -> list[Row]:
    results, cpu = record["results"], cpu_label(record["machine"])
    configurations = _by_role(results["configurations"])
    served = configurations["served"]["tokens_per_s"]
    return [
        Row(f"single-stream decode ({results['tokens']} tokens)", served, peer["name"], peer["tokens_per_s"], "tok/s",
            "higher", cpu)
        for role, peer in configurations.items()
        if role.startswith("transformers")
    ]  # fmt: skip


def startup_rows(record: dict) -> list[Row]:
    import statistics

    results = record["results"]
    return [
        Row(
            "time from launch to serving (median)",
            statistics.median(results["dpgate_to_serving_s"]),
            "transformers to a first token",
            statistics.median(results["transformers_to_first_token_s"]),
            "s",
            "lower",
            cpu_label(record["machine"]),
        )
    ]


def gateway_rows(record: dict) -> list[Row]:
    results, cpu = record["results"], cpu_label(record["machine"])
    targets = {t["role"]: {s["scenario"]: s for s in t["scenarios"]} for t in results["targets"]}
    direct, peer, ours = targets["direct"], targets["peer"], targets["dpgate"]
    name = next(t["name"] for t in results["targets"] if t["role"] == "peer").removesuffix(" (peer)")
    c = results["concurrency"]
    rows = []
    for kind in ("unary", "stream"):
        base = direct[f"{kind} c=1"]["p50_ms"]
        rows.append(Row(f"{kind} call, added p50 latency at c=1", ours[f"{kind} c=1"]["p50_ms"] - base, name,
                        peer[f"{kind} c=1"]["p50_ms"] - base, "ms", "lower", cpu))  # fmt: skip
    unit = {"unary": "calls/s", "stream": "messages/s"}
    for kind in ("unary", "stream"):
        scenario = f"{kind} c={c}"
        rows.append(Row(f"{kind} {unit[kind]} at c={c}", ours[scenario]["per_second"], name,
                        peer[scenario]["per_second"], unit[kind], "higher", cpu))  # fmt: skip
        if ours[scenario]["cpu_us"] and peer[scenario]["cpu_us"]:
            what = "call" if kind == "unary" else "relayed message"
            rows.append(Row(f"proxy CPU per {what} at c={c}", ours[scenario]["cpu_us"], name,
                            peer[scenario]["cpu_us"], "us", "lower", cpu))  # fmt: skip
    return rows


def grammar_rows(record: dict) -> list[Row]:
    results = record["results"]
    conditions = results["conditions"]
    return [
        Row(
            f"decode at batch {results['batch']} under a JSON schema (target >= {results['target_ratio']}x)",
            conditions["json schema"]["tokens_per_s"],
            "the same batch unconstrained",
            conditions["unconstrained"]["tokens_per_s"],
            "tok/s",
            "higher",
            cpu_label(record["machine"]),
        )
    ]


def dcp_rows(record: dict) -> list[Row]:
    results, cpu = record["results"], cpu_label(record["machine"])
    configs = {(c["tp"], c["dcp"]): c["rows"] for c in results["configurations"]}
    dcp, replicated = configs[(2, 2)][-1], configs[(2, 1)][-1]
    context = dcp["context"]
    return [
        Row(f"DCP decode {what} at {context:,} tokens of context (T2 C2)", dcp[key], "T2 C1, the KV head replicated",
            replicated[key], unit, "lower", cpu)
        for what, key, unit in (("attention", "attention_ms", "ms"), ("step", "step_ms", "ms"),
                                ("KV bytes per rank", "kv_mb_per_rank", "MB"))
    ]  # fmt: skip


def llamacpp_rows(record: dict) -> list[Row]:
    """engine_vs_llamacpp.py's own rows: {"figure", "dpgate", "llama.cpp", "ratio", "unit"}; a unit
    of time (s, ms, us) is one where lower is better."""
    cpu = cpu_label(record.get("machine"))
    return [
        Row(row["figure"], row["dpgate"], "llama.cpp", row["llama.cpp"], row["unit"],
            "lower" if row["unit"] in ("s", "ms", "us") else "higher", cpu)
        for row in record["results"]["rows"]
    ]  # fmt: skip


def prefix_cache_rows(record: dict) -> list[Row]:
    """Each workload with the prefix cache against the same engine without it."""
    cpu = cpu_label(record["machine"])
    rows = []
    for case in record["results"]["cases"]:
        on, off, name = case["on"], case["off"], f"({case['case']}) {case['name']}"
        rows.append(Row(f"TTFT p50, {name}", on["ttft_p50_ms"], "prefix cache off", off["ttft_p50_ms"], "ms",
                        "lower", cpu))  # fmt: skip
        rows.append(Row(f"output throughput, {name}", on["output_tokens_per_s"], "prefix cache off",
                        off["output_tokens_per_s"], "tok/s", "higher", cpu))  # fmt: skip
    return rows


def routing_rows(record: dict) -> list[Row]:
    """Per workload, cache-aware against the best other policy of the same run (the issue's targets)."""
    cpu = cpu_label(record["machine"])
    rows = []
    for case in record["results"]["cases"]:
        runs, name = case["runs"], f"({case['case']}) {case['name']}"
        others = {policy: run for policy, run in runs.items() if policy != "cache-aware"}
        if "cache-aware" not in runs or not others:
            continue
        ours = runs["cache-aware"]
        fastest = min(others, key=lambda policy: others[policy]["ttft_p50_ms"])
        busiest = max(others, key=lambda policy: others[policy]["output_tokens_per_s"])
        rows.append(Row(f"routing TTFT p50, {name}", ours["ttft_p50_ms"], fastest, others[fastest]["ttft_p50_ms"],
                        "ms", "lower", cpu))  # fmt: skip
        rows.append(Row(f"routing output throughput, {name}", ours["output_tokens_per_s"], busiest,
                        others[busiest]["output_tokens_per_s"], "tok/s", "higher", cpu))  # fmt: skip
    return rows


ROWS = {
    "engine_vs_llamacpp": llamacpp_rows,
    "throughput": throughput_rows,
    "engine_vs_transformers": engine_rows,
    "startup": startup_rows,
    "gateway_overhead": gateway_rows,
    "grammar_overhead": grammar_rows,
    "dcp_scaling": dcp_rows,
    "prefix_cache": prefix_cache_rows,
    "routing": routing_rows,
}
