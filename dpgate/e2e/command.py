"""`dpgate e2e`: flags, their validation (one sentence, exit 2), then one topology or a matrix run
stage by stage, the table printed and the sentinel written; the exit status follows the verdict
(docs/e2e.md has the table)."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from dpgate.e2e.contracts import Topology
from dpgate.e2e.local_hosts import HOST_KINDS
from dpgate.e2e.matrix import CI_TOPOLOGY, CI_WORKLOADS, default_hosts, matrix, table
from dpgate.e2e.model_fit import split_problem
from dpgate.e2e.plan import Budgets, RunSettings
from dpgate.e2e.runner import run_topology
from dpgate.e2e.verdict import RunRecord, exit_status, sentinel, write_sentinel
from dpgate.e2e.workloads import REGISTRY, WorkloadError, resolve

_BUDGETS = Budgets()
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


class UsageError(ValueError):
    """A flag's value breaks its rule; the message names the flag."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--data-parallel-size",
        "--dp",
        type=int,
        metavar="N",
        help=f"engines behind the gateway (default {CI_TOPOLOGY.dp})",
    )
    add(
        "--tensor-parallel-size", "--tp", type=int, metavar="T", help=f"processes per engine (default {CI_TOPOLOGY.tp})"
    )
    add(
        "--decode-context-parallel-size",
        "--dcp",
        type=int,
        metavar="C",
        help=f"TP ranks per engine that split the KV cache's tokens; divides --tp (default {CI_TOPOLOGY.dcp})",
    )
    add("--model", help=f"a known model name, GGUF file or Hugging Face directory (default {CI_TOPOLOGY.model})")
    add("--model-sha256", metavar="HEX", help="the sha256 the --model file must have (known models: their package's)")
    add("--hosts", choices=HOST_KINDS, help="local (127.0.0.1) or netns (a network namespace each; needs root)")
    add(
        "--workload",
        action="append",
        metavar="NAME",
        help=f"repeatable: {', '.join(REGISTRY)}, or MODULE:FUNCTION (default: the matrix's)",
    )
    add("--matrix", choices=("ci", "full"), help="run a matrix of topologies instead of one")
    add(
        "--preflight-budget",
        type=float,
        metavar="SECONDS",
        default=_BUDGETS.preflight_s,
        help="seconds (default %(default)g)",
    )
    add(
        "--launch-budget",
        type=float,
        metavar="SECONDS",
        default=_BUDGETS.launch_s,
        help="seconds (default %(default)g)",
    )
    add(
        "--bringup-budget",
        type=float,
        metavar="SECONDS",
        default=_BUDGETS.bringup_s,
        help="seconds (default %(default)g)",
    )
    add(
        "--workload-budget",
        type=float,
        metavar="SECONDS",
        default=_BUDGETS.workload_s,
        help="seconds per workload (default %(default)g)",
    )
    add("--gateway-port", type=int, metavar="PORT", help="the gateway's port (default: a free one)")
    add("--engine-base-port", type=int, metavar="BASE", help="engine rank R listens on BASE + R (default: free ones)")
    add(
        "--kv-cache-memory-mb",
        type=int,
        metavar="MB",
        default=512,
        help="each engine process's KV cache (default %(default)s)",
    )
    add(
        "--health-interval",
        type=float,
        metavar="SECONDS",
        default=0.5,
        help="seconds between the gateway's probes (default %(default)g)",
    )
    add("--run-dir", type=Path, help="where every child's log goes (default: a new dpgate-e2e-* under $TMPDIR)")
    add("--result", type=Path, metavar="FILE", help="the JSON sentinel (default: RUN_DIR/result.json)")
    add("--dry-run", action="store_true", help="run preflight and print the plan; launch nothing")  # fmt: skip


def _check(args: argparse.Namespace) -> None:
    """Raise UsageError for the first flag that breaks its rule."""
    topology_flags = (args.data_parallel_size, args.tensor_parallel_size, args.decode_context_parallel_size, args.model)
    if args.matrix and any(flag is not None for flag in topology_flags):
        raise UsageError("--matrix chooses the topologies: give no --dp, --tp, --dcp or --model with it.")
    if args.matrix and (args.model_sha256 or args.gateway_port or args.engine_base_port):
        raise UsageError("--model-sha256, --gateway-port and --engine-base-port name one topology: not with --matrix.")
    for flag, value in (("--dp", args.data_parallel_size), ("--tp", args.tensor_parallel_size),
                        ("--dcp", args.decode_context_parallel_size)):  # fmt: skip
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value} must be at least 1.")
    topology = _topology(args)
    if topology.tp % topology.dcp:
        raise UsageError(f"--dcp {topology.dcp} must divide --tp {topology.tp}.")
    problem = None if args.matrix else split_problem(topology)
    if problem:
        raise UsageError(f"--model {topology.model} does not split as asked: {problem}.")
    for flag in ("preflight", "launch", "bringup", "workload"):
        value = getattr(args, f"{flag}_budget")
        if not value > 0:
            raise UsageError(f"--{flag}-budget {value} must be more than 0 seconds.")
    if args.gateway_port is not None and not 1 <= args.gateway_port <= 65535:
        raise UsageError(f"--gateway-port {args.gateway_port} must be in 1..65535.")
    if args.engine_base_port is not None:
        last = args.engine_base_port + topology.dp - 1
        if args.engine_base_port < 1 or last > 65535:
            raise UsageError(f"--engine-base-port {args.engine_base_port}: ports up to {last} must lie in 1..65535.")
        if args.gateway_port is not None and args.engine_base_port <= args.gateway_port <= last:
            raise UsageError(f"--gateway-port {args.gateway_port} lies among the engines' ports (--engine-base-port).")
    if args.model_sha256 is not None and not _SHA256.fullmatch(args.model_sha256):
        raise UsageError(f"--model-sha256 {args.model_sha256} must be 64 hexadecimal digits.")
    if args.kv_cache_memory_mb < 1:
        raise UsageError(f"--kv-cache-memory-mb {args.kv_cache_memory_mb} must be at least 1.")
    if not args.health_interval > 0:
        raise UsageError(f"--health-interval {args.health_interval} must be more than 0 seconds.")
    for name in args.workload or ():
        try:
            resolve(name)
        except WorkloadError as error:
            raise UsageError(f"{error}.") from error


def _topology(args: argparse.Namespace) -> Topology:
    return Topology(
        dp=args.data_parallel_size or CI_TOPOLOGY.dp,
        tp=args.tensor_parallel_size or CI_TOPOLOGY.tp,
        dcp=args.decode_context_parallel_size or CI_TOPOLOGY.dcp,
        model=args.model or CI_TOPOLOGY.model,
    )


def settings_list(args: argparse.Namespace, run_dir: Path) -> list[RunSettings]:
    budgets = Budgets(args.preflight_budget, args.launch_budget, args.bringup_budget, args.workload_budget)
    if args.matrix:
        entries = [(entry.topology, entry.workloads, run_dir / entry.topology.name) for entry in matrix(args.matrix)]
    else:
        entries = [(_topology(args), CI_WORKLOADS, run_dir)]
    return [
        RunSettings(
            topology=topology,
            hosts=args.hosts or default_hosts(args.matrix),
            workloads=tuple(args.workload) if args.workload else workloads,
            budgets=budgets,
            run_dir=directory,
            gateway_port=args.gateway_port,
            engine_base_port=args.engine_base_port,
            model_sha256=args.model_sha256,
            kv_cache_memory_mb=args.kv_cache_memory_mb,
            health_interval_s=args.health_interval,
        )
        for topology, workloads, directory in entries
    ]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a scheduler's stop) ends the run like Ctrl-C: children stopped, sentinel written.
    SIGINT is handled here too, also where it was inherited as ignored (a background job)."""
    raise KeyboardInterrupt


def log(line: str) -> None:
    print(f"dpgate e2e: {line}", flush=True)


def _check_matrix_workloads(runs: list[RunSettings]) -> None:
    """A matrix's own workloads must exist before its first topology starts, not an hour in."""
    for name in dict.fromkeys(name for settings in runs for name in settings.workloads):
        try:
            resolve(name)
        except WorkloadError as error:
            raise UsageError(f"{error} (a workload of the matrix; --workload chooses others).") from error


def _splittable(runs: list[RunSettings]) -> tuple[list[RunSettings], list[dict[str, str]]]:
    """A matrix's topologies that the model can split, and those left out with the reason
    (SmolLM2-135M's 9 query heads have no TP2 split)."""
    kept, left_out = [], []
    for settings in runs:
        problem = split_problem(settings.topology)
        if problem:
            left_out.append({"topology": settings.topology.name, "reason": problem})
        else:
            kept.append(settings)
    return kept, left_out


def run(args: argparse.Namespace) -> int:
    run_dir = args.run_dir or Path(tempfile.gettempdir()) / f"dpgate-e2e-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    try:
        _check(args)
        runs = settings_list(args, run_dir)
        _check_matrix_workloads(runs)
    except UsageError as error:
        print(f"dpgate e2e: error: {error}", file=sys.stderr)
        return 2
    runs, left_out = _splittable(runs) if args.matrix else (runs, [])
    for entry in left_out:
        log(f"left out {entry['topology']}: {entry['reason']}")
    result = args.result or run_dir / "result.json"
    log(f"run dir {run_dir}, sentinel {result}")
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    records: list[RunRecord] = []
    try:
        for settings in runs:
            workloads = ", ".join(settings.workloads)
            log(f"topology {settings.topology.name} on {settings.hosts} hosts, workloads {workloads}")
            records.append(run_topology(settings, log, dry_run=args.dry_run))
            if records[-1].interrupted:
                break
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    document = sentinel(records, args.matrix, left_out)
    write_sentinel(result, document)
    print(table(records), flush=True)
    failure = f" ({document['failure_class'] or 'interrupted'}): {document['detail']}" if document["detail"] else ""
    log(f"verdict {document['verdict']}{failure}")
    return exit_status(records)
