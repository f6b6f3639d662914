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
    # dpgate as a user gets it (over gRPC) where the run has it; runs from before only had the core
    user = configurations.get("served-grpc", configurations["served"])
    served = user["tokens_per_s"]
    rows = [
        Row(f"single-stream decode ({results['tokens']} tokens)", served, peer["name"], peer["tokens_per_s"], "tok/s",
            "higher", cpu)
        for role, peer in configurations.items()
        if role.startswith("transformers")
    ]  # fmt: skip
    if "served-grpc" in configurations:
        core = configurations["served"]
        rows.append(Row(f"single-stream decode ({results['tokens']} tokens), served over gRPC", served,
                        "its own core in-process", core["tokens_per_s"], "tok/s", "higher", cpu))  # fmt: skip
    return rows


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
    """dpgate's gateway against each proxy of the run: Envoy (one worker) where the run had it, then
    the bare grpc.aio relay. Added latency is a ratio only where both proxies add some (a proxy can
    make a stream faster than a direct call, by sending its messages in fewer packets): otherwise
    the row compares the whole p50."""
    results, cpu = record["results"], cpu_label(record["machine"])
    by_role = {t["role"]: t for t in results["targets"]}
    targets = {role: {s["scenario"]: s for s in t["scenarios"]} for role, t in by_role.items()}
    direct, ours = targets["direct"], targets["dpgate"]
    c = results["concurrency"]
    unit = {"unary": "calls/s", "stream": "messages/s"}
    rows = []
    for role in ("envoy", "peer"):
        if role not in targets:
            continue
        peer, name = targets[role], by_role[role]["name"].removesuffix(" (peer)")
        for kind in ("unary", "stream"):
            base, mine, theirs = direct[f"{kind} c=1"]["p50_ms"], ours[f"{kind} c=1"], peer[f"{kind} c=1"]
            if mine["p50_ms"] > base and theirs["p50_ms"] > base:
                rows.append(Row(f"{kind} call, added p50 latency at c=1", mine["p50_ms"] - base, name,
                                theirs["p50_ms"] - base, "ms", "lower", cpu))  # fmt: skip
            else:
                rows.append(Row(f"{kind} call, p50 latency at c=1 (direct {base:.3f} ms)", mine["p50_ms"], name,
                                theirs["p50_ms"], "ms", "lower", cpu))  # fmt: skip
            if role == "envoy":
                rows.append(Row(f"{kind} call, p99 latency at c=1", mine["p99_ms"], name, theirs["p99_ms"], "ms",
                                "lower", cpu))  # fmt: skip
        for kind in ("unary", "stream"):
            scenario = f"{kind} c={c}"
            rows.append(Row(f"{kind} {unit[kind]} at c={c}", ours[scenario]["per_second"], name,
                            peer[scenario]["per_second"], unit[kind], "higher", cpu))  # fmt: skip
            if ours[scenario]["cpu_us"] and peer[scenario]["cpu_us"]:
                what = "call" if kind == "unary" else "relayed message"
                rows.append(Row(f"proxy CPU per {what} at c={c}", ours[scenario]["cpu_us"], name,
                                peer[scenario]["cpu_us"], "us", "lower", cpu))  # fmt: skip
    return rows


def http_rows(record: dict) -> list[Row]:
    """HTTP (dpgate's OpenAI API) against the gRPC path through the same gateway."""
    results, cpu = record["results"], cpu_label(record["machine"])
    paths = {name: {s["scenario"]: s for s in scenarios} for name, scenarios in results["paths"].items()}
    http, grpc = paths["http"], paths["grpc"]
    scenario = f"unary c={results['concurrency']}"
    return [
        Row("HTTP /v1/completions p50 at c=1", http["unary c=1"]["p50_ms"], "gRPC Generate",
            grpc["unary c=1"]["p50_ms"], "ms", "lower", cpu),
        Row(f"HTTP calls/s at {scenario.removeprefix('unary ')}", http[scenario]["per_second"], "gRPC Generate",
            grpc[scenario]["per_second"], "calls/s", "higher", cpu),
        Row(f"gateway CPU per HTTP call at {scenario.removeprefix('unary ')}", http[scenario]["cpu_us"],
            "gRPC Generate", grpc[scenario]["cpu_us"], "us", "lower", cpu),
    ]  # fmt: skip


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
    text = record["results"].get("text_multi_turn") or []
    if len(text) == 2:  # --llamacpp: dpgate serve and llama.cpp's server, cache on in both
        ours, theirs = text
        peer = theirs["server"]
        rows.append(Row("TTFT p50, (a) multi-turn as text over HTTP", ours["ttft_p50_ms"], peer,
                        theirs["ttft_p50_ms"], "ms", "lower", cpu))  # fmt: skip
        rows.append(Row("output throughput, (a) multi-turn as text over HTTP", ours["output_tokens_per_s"], peer,
                        theirs["output_tokens_per_s"], "tok/s", "higher", cpu))  # fmt: skip
    return rows


def served_rows(record: dict) -> list[Row]:
    """served_vs_core.py: dpgate over gRPC against its own core in-process (the ceiling; 0.9 the target)."""
    results, cpu = record["results"], cpu_label(record["machine"])
    figures = (
        ("batch1_decode", f"batch-1 decode ({results['decode_tokens']} tokens), served over gRPC", "tok/s"),
        ("in_flight", f"{results['concurrency']} in flight x {results['prompt_tokens']}+{results['output_tokens']}"
                      " tokens, served over gRPC", "output tok/s"),
    )  # fmt: skip
    return [
        Row(figure, results[key]["served"], "its own core in-process", results[key]["core"], unit, "higher", cpu)
        for key, figure, unit in figures
    ]


def vllm_rows(record: dict) -> list[Row]:
    """engine_vs_vllm.py: dpgate as served against vLLM's CPU build; figures are {figure: {system: value}}
    with dpgate's system first, and the sweep's TTFT p50 at each in-flight count (lower is better)."""
    results, cpu = record["results"], cpu_label(record["machine"])
    rows = []
    for figure, by_system in results["figures"].items():
        (_, dpgate_value), (peer, peer_value) = by_system.items()
        rows.append(Row(figure.rsplit(" (", 1)[0], dpgate_value, peer, peer_value, "tok/s", "higher", cpu))
    (_, sweep), (peer, peer_sweep) = results["sweep"].items()
    for in_flight, figures in sweep.items():
        rows.append(Row(f"TTFT p50 at {in_flight} in flight", figures["ttft_p50_ms"], peer,
                        peer_sweep[in_flight]["ttft_p50_ms"], "ms", "lower", cpu))  # fmt: skip
    return rows


def cache_aware_path_rows(record: dict) -> list[Row]:
    """cache_aware_path.py: the gateway's cache-aware path (tokenize, hash, score) against its relay path."""
    results, cpu = record["results"], cpu_label(record["machine"])
    relay, aware = results["paths"]["relay (pinned)"], results["paths"]["cache-aware (unpinned)"]
    prompt = f"{results['prompt_tokens']:,}-token prompt"
    if results.get("unique_tokens"):  # records before --unique-tokens sent one prompt
        prompt += f" ({results['unique_tokens']:,} tokens unique per call)"
    return [
        Row(f"gateway unary p50 at c=1, {prompt}, cache-aware path", aware["p50_ms"], "relay path (pinned)",
            relay["p50_ms"], "ms", "lower", cpu),
        Row(f"gateway CPU per call, {prompt}, cache-aware path", aware["cpu_us_per_call"], "relay path (pinned)",
            relay["cpu_us_per_call"], "us", "lower", cpu),
    ]  # fmt: skip


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
    "engine_vs_vllm": vllm_rows,
    "served_vs_core": served_rows,
    "engine_vs_llamacpp": llamacpp_rows,
    "throughput": throughput_rows,
    "engine_vs_transformers": engine_rows,
    "startup": startup_rows,
    "gateway_overhead": gateway_rows,
    "http_overhead": http_rows,
    "grammar_overhead": grammar_rows,
    "dcp_scaling": dcp_rows,
    "prefix_cache": prefix_cache_rows,
    "routing": routing_rows,
    "cache_aware_path": cache_aware_path_rows,
}
