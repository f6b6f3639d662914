"""docs/performance.md's generated section: the ratio table, the plots, dpgate against llama.cpp
and how long each benchmark took, spliced between two markers so the hand-written sections around
them (history, explanations) survive every run."""

from __future__ import annotations

import math
from pathlib import Path

from report_ratios import ROWS, Row, cpu_label

BEGIN = "<!-- BEGIN GENERATED: python bench/report.py (everything up to END is rewritten) -->"
END = "<!-- END GENERATED -->"


def format_value(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    magnitude = abs(value)
    digits = ",.0f" if magnitude >= 1000 else ".1f" if magnitude >= 10 else ".2f" if magnitude >= 1 else ".3f"
    return f"{value:{digits}} {unit}"


def ratio_table(rows: list[Row]) -> list[str]:
    lines = ["| figure | dpgate | peer | ratio | CPU |", "|---|---|---|---|---|"]
    for row in rows:
        ratio = "n/a" if math.isnan(row.ratio) else f"**{row.ratio:.2f}x** ({row.better} is better)"
        peer = f"{format_value(row.peer_value, row.unit)} ({row.peer})"
        lines.append(f"| {row.figure} | {format_value(row.dpgate, row.unit)} | {peer} | {ratio} | {row.cpu} |")
    return lines


def _recorded(record: dict) -> str:
    commit = f", commit {record['commit']}" if record.get("commit") else ""
    return f"{record.get('recorded_at', 'undated')}{commit}"


def _missing(name: str, runs: dict[str, dict], benchmarks) -> str:
    """Why a benchmark has no results: not in this checkout, failed, or not run."""
    benchmark = next(b for b in benchmarks if b.name == name)
    if not benchmark.script.exists():
        return f"`bench/{name}.py` is not in this checkout: skipped."
    if name in runs and "error" in runs[name]:
        return f"`bench/{name}.py` failed (exit {runs[name]['exit']}): `{runs[name]['error']}`"
    return f"`bench/{name}.py` has no results here: run `python bench/report.py --only {name}`."


def plots_section(found: dict[str, dict], figures: Path, runs: dict, benchmarks) -> list[str]:
    from report_plots import PLOTS

    figures.mkdir(parents=True, exist_ok=True)
    lines = ["### Plots", ""]
    for name, file_name, title, draw in PLOTS:
        lines += [f"#### {title}", ""]
        record = found.get(name)
        if record is None:
            lines += [_missing(name, runs, benchmarks), ""]
            continue
        if name == "throughput" and not record["results"].get("sweep"):
            lines += ["Not drawn: these results hold no concurrency sweep (`bench/throughput.py --concurrencies`).", ""]
            continue
        caption = draw(record, figures / file_name)
        lines += [
            f"![{title}, {cpu_label(record['machine'])}]({figures.name}/{file_name})",
            "",
            f"*{caption} CPU: {cpu_label(record['machine'])}; recorded {_recorded(record)}.*",
            "",
        ]
    return lines


def llamacpp_section(found: dict[str, dict], runs: dict, benchmarks) -> list[str]:
    lines = ["### dpgate against llama.cpp on the same GGUF", ""]
    record = found.get("engine_vs_llamacpp")
    if record is None:
        return [*lines, _missing("engine_vs_llamacpp", runs, benchmarks), ""]
    return [*lines, *ratio_table(ROWS["engine_vs_llamacpp"](record)), "", f"Recorded {_recorded(record)}.", ""]


def times_section(found: dict[str, dict], runs: dict[str, dict]) -> list[str]:
    lines = [
        "### How long each benchmark took",
        "",
        "One after another, never two at once (on two cores they would measure each other).",
        "",
        "| benchmark | command | seconds | load average before / after |",
        "|---|---|---|---|",
    ]
    for name, record in runs.items():
        command = " ".join(record["command"])
        lines.append(
            f"| {name} | `{command}` | {record['wall_s']:.0f} | {record['load_before']} / {record['load_after']} |"
        )
    total = sum(record["wall_s"] for record in runs.values())
    lines += [f"| all | | **{total:.0f}** ({total / 60:.1f} min) | |", ""]
    return lines


def generated_section(
    found: dict[str, dict], runs: dict[str, dict], figures: Path, benchmarks, not_run: dict[str, str]
) -> str:
    rows: list[Row] = []
    for name, to_rows in ROWS.items():
        if name in found:
            rows += to_rows(found[name])
    dates = sorted(record["recorded_at"] for record in found.values() if record.get("recorded_at"))
    lines = [BEGIN, "", "## Summary: dpgate against its peers (generated)", ""]
    if any(record.get("quick") for record in runs.values()):
        lines += [
            "> **Smoke test (`bench/report.py --quick`): sizes cut down, machine possibly busy. These are not",
            "> figures to quote; `python bench/report.py` on a quiet machine makes the real ones.**",
            "",
        ]
    lines += [
        f"Written by `python bench/report.py` from the benchmarks' JSON (recorded {dates[0] if dates else 'never'}"
        f" to {dates[-1] if dates else 'never'}); every peer ran beside dpgate in the same run, on the same machine.",
        "Ratios are dpgate / peer. Only this section is generated; the sections after it are written by hand.",
        "",
        *ratio_table(rows),
        "",
        *plots_section(found, figures, runs, benchmarks),
        *llamacpp_section(found, runs, benchmarks),
    ]
    from report_plots import PLOTS

    drawn = set(ROWS) | {name for name, *_ in PLOTS}
    others = [name for name in found if name not in drawn]
    if others:
        listed = ", ".join(f"{name} (`{name}.json`)" for name in others)
        lines += ["### Recorded without a peer", "", f"Kept in the results directory, not tabulated: {listed}.", ""]
    if runs:
        lines += times_section(found, runs)
    skipped = [f"`bench/{name}.py` ({why})" for name, why in not_run.items()]
    if skipped:
        lines += [f"Not run by the report: {'; '.join(skipped)}.", ""]
    return "\n".join([*lines, END])


def render_into(
    document: str, found: dict[str, dict], runs: dict[str, dict], figures: Path, benchmarks,
    not_run: dict[str, str] | None = None,
) -> str:  # fmt: skip
    """`document` with its generated section replaced, or inserted after the title line when it has
    none yet; the rest of the text is kept as it is. `not_run`: the scripts under bench/ the report
    does not run, each with why (listed under the table)."""
    section = generated_section(found, runs, figures, benchmarks, not_run or {})
    start, end = document.find(BEGIN), document.find(END)
    if start >= 0 and end > start:
        return document[:start] + section + document[end + len(END) :]
    if start >= 0 or end >= 0:
        raise ValueError(f"the document holds only one of the markers {BEGIN!r} and {END!r}")
    title, newline, rest = document.partition("\n")
    if not title.startswith("# "):
        return f"{section}\n\n{document}"
    return f"{title}{newline}\n{section}\n\n{rest.lstrip(chr(10))}"
