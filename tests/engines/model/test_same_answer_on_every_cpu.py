"""The kernels give the scalar reference's bits on every instruction set, and the rest of the
served path does not lean on the CPU's vector math either (rotary tables and logprobs are
computed in float64, then rounded): greedy tokens and logprobs are identical whichever of this
CPU's instruction sets runs them, with torch's own kernels capped to match. On an AVX2-only
machine that compares AVX2 with the reference; on an AVX-512 one all three."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engines import kernels

pytestmark = pytest.mark.e2e  # every test here starts a process

# torch's own dispatch level for each kernel instruction set ("default" is its baseline code).
ATEN_CAPABILITY = {"avx512_vnni": "avx512", "avx512": "avx512", "avx2": "avx2", "scalar": "default"}


def probe(isa: str, quantization: str = "int8") -> dict:
    env = dict(os.environ, ATEN_CPU_CAPABILITY=ATEN_CAPABILITY[isa])
    command = [sys.executable, "-m", "tests.engines.greedy_probe", isa, quantization]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_instruction_set_gives_the_same_tokens_and_logprobs():
    results = {isa: probe(isa) for isa in kernels.supported_isas()}
    assert {isa: r["kernels"] for isa, r in results.items()} == {isa: f"batch-invariant/{isa}" for isa in results}
    reference = results["scalar"]["outputs"]
    assert len(reference) == 3 and all(len(tokens) == 12 for tokens in reference.values())
    for isa, result in results.items():
        assert result["outputs"] == reference, f"{isa} differs from the scalar reference"


def test_int_dot_gives_the_same_tokens_and_logprobs_on_every_instruction_set():
    """The integer sums are the same integers on every set (vpdpbusd, widening, scalar)."""
    results = {isa: probe(isa, "int-dot") for isa in kernels.supported_isas()}
    reference = results["scalar"]["outputs"]
    for isa, result in results.items():
        assert result["outputs"] == reference, f"{isa} differs from the scalar reference under int-dot"
