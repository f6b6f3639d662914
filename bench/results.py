"""The `--json FILE` every benchmark writes beside what it prints, so bench/report.py can tabulate
and plot the figures without parsing text.

One envelope for all of them:
    {"benchmark": "throughput", "machine": {...}, "command": [...], "recorded_at": "...",
     "commit": "...", "results": {...}}
`machine` names the CPU the figures came from (its model and the flags numerics are chosen by),
because an engine figure means nothing without it; `results` is each benchmark's own shape.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", type=Path, help="also write the figures to FILE as JSON")


def machine_record(with_torch: bool = True) -> dict:
    """The CPU and how the bench used it; `with_torch=False` for benches that load no torch (gateway)."""
    from machine import describe_machine

    from engines.kernels.cpu import cpu_info

    info = cpu_info()
    return {
        "cpu": info.describe(),
        "cpu_model": info.model,
        "cpu_flags": {
            "avx2": info.has_avx2,
            "avx512": info.has_avx512,
            "native_bf16": info.has_native_bf16,
            "amx": "amx_bf16" in info.flags,
        },
        "cores": os.cpu_count(),
        "description": describe_machine(with_torch),
        "python": sys.version.split()[0],
    }


def _commit() -> str | None:
    try:
        result = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return None
    return result.stdout.strip() or None


def write_results(path: Path | None, benchmark: str, results: dict, with_torch: bool = True) -> None:
    """Write the envelope to `path` (nothing when None) through a temporary file and a rename, so a
    reader never sees half a file, even when the bench is killed while writing."""
    if path is None:
        return
    record = {
        "benchmark": benchmark,
        "machine": machine_record(with_torch),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "recorded_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "results": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(record, indent=1) + "\n")
    temporary.replace(path)
