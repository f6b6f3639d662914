"""The pure core loads no torch and no grpc: importing it in a fresh interpreter leaves them out of
sys.modules (the import contracts in pyproject.toml say the same statically; this checks what
Python actually loads, lazy imports included)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PURE_CORE = (
    "engines.scheduling.scheduler",
    "engines.scheduling.sequence",
    "engines.scheduling.detokenizer",
    "engines.kv.block_manager",
    "engines.grammar.spec",
    "engines.grammar.errors",
    "engines.sampling.params",
    "engines.sampling.tokens",
    "gateway.routing",
    "gateway.metadata",
    "gateway.health_state",
)
HEAVY = ("torch", "grpc", "numpy", "xgrammar", "transformers")


def heavy_modules_loaded_by(module: str) -> list[str]:
    """Which of HEAVY a fresh interpreter has loaded after `import module`."""
    probe = f"import sys, json, {module}; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(loaded.stdout)


@pytest.mark.parametrize("module", PURE_CORE)
def test_importing_a_pure_core_module_loads_neither_torch_nor_grpc(module: str) -> None:
    assert heavy_modules_loaded_by(module) == []


def test_the_probe_sees_a_heavy_import() -> None:
    """The same probe on a module that does use torch: the check above can fail."""
    assert "torch" in heavy_modules_loaded_by("engines.sampling.sampler")
