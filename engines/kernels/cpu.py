"""What this CPU does natively: its model name and the instruction-set flags dpgate decides by.

Read once from /proc/cpuinfo (Linux's names for the flags); engines/model/numerics.py turns it into the
served dtype and kernels, and every benchmark prints `describe()` beside its figures.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# The flags that decide numerics, as /proc/cpuinfo names them, and how they are reported.
_REPORTED = (
    ("avx2", "AVX2"),
    ("fma", "FMA"),
    ("avx512f", "AVX-512"),
    ("avx512_bf16", "AVX512-BF16"),
    ("amx_bf16", "AMX"),
)


@dataclass(frozen=True, slots=True)
class CpuInfo:
    model: str
    flags: frozenset[str]

    @property
    def has_avx2(self) -> bool:
        return {"avx2", "fma"} <= self.flags

    @property
    def has_avx512(self) -> bool:
        return {"avx512f", "avx512bw"} <= self.flags

    @property
    def has_native_bf16(self) -> bool:
        """bfloat16 arithmetic in hardware (AVX512-BF16 or AMX); elsewhere torch emulates it, slowly."""
        return "avx512_bf16" in self.flags or {"amx_bf16", "amx_tile"} <= self.flags

    def describe(self) -> str:
        """e.g. 'AMD EPYC 7B13 (AVX2 yes, FMA yes, AVX-512 no, AVX512-BF16 no, AMX no)'."""
        marks = ", ".join(f"{label} {'yes' if flag in self.flags else 'no'}" for flag, label in _REPORTED)
        return f"{self.model} ({marks})"


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor's model name and flags from /proc/cpuinfo's text."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model or platform.processor() or platform.machine(), flags)


@cache
def cpu_info() -> CpuInfo:
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return CpuInfo(platform.processor() or platform.machine(), frozenset())
