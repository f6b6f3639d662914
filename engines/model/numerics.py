"""The one place that decides an engine's numerics: compute dtype, weight storage, kernels.

The served default (`--dtype auto`, `--quantization auto`, `--batch-invariant`) is float32
activations computed by dpgate's batch-invariant kernels (engines/kernels) on the widest
instruction set the CPU has, over the GGUF's own blocks by integer dot products (int-dot, below)
where the checkpoint is a GGUF (tensor-parallel ranks take their rows of its blocks), else over
int8 weights (a safetensors checkpoint, or torch's kernels).
int-dot is the default because it is the fastest measured on every machine kind (AVX2 included)
and its integer sums give the same bits on every instruction set. The float kernels accumulate in
float32 FMAs on every CPU, so bfloat16 activations would add rounding without adding speed: auto
picks float32.
`--no-batch-invariant` swaps them for torch's kernels, whose speed does depend on the dtype:
there auto picks bfloat16 only where the CPU computes it natively (AVX512-BF16 or AMX), since
elsewhere torch emulates bfloat16 matmuls 4.5 to 6.5x slower than float32. An explicit `--dtype`
always wins. `--quantization int-dot` multiplies the GGUF's blocks by activations
quantized to int8 with exact integer sums (engines/kernels/csrc/int_linear.h) and needs the
batch-invariant kernels; where the CPU has AVX512-VNNI and its self-check passed, the kernels run
as avx512_vnni (vpdpbusd for those sums; every other kernel is avx512's code, so the choice
changes no bit). docs/engine.md says what each choice costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engines.kernels.cpu import CpuInfo

if TYPE_CHECKING:
    import torch

AUTO_DTYPE = "auto"
AUTO_QUANTIZATION = "auto"
INT_DOT = "int-dot"
# Instruction sets of the kernels, fastest first (engines/kernels/build.py builds each);
# avx512_vnni differs from avx512 only in the integer kernels.
KERNEL_ISAS = ("avx512_vnni", "avx512", "avx2", "scalar")


class NumericsError(ValueError):
    """A combination the engine cannot serve; one sentence naming the flag."""


@dataclass(frozen=True, slots=True)
class Numerics:
    dtype: str  # "float32", "bfloat16" or "float16": activations and the KV cache
    quantization: str  # "int8" (a scale per output row), "gguf" (the file's blocks), "int-dot" or "none"
    batch_invariant: bool
    isa: str | None  # the kernels' instruction set when batch_invariant, else None
    reason: str  # why this dtype (and quantization, when auto chose it), in a few words, for the start-up log

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)

    @property
    def kernels(self) -> str:
        """What GetModelInfo reports: 'batch-invariant/avx2' or 'torch'."""
        return f"batch-invariant/{self.isa}" if self.batch_invariant else "torch"

    def describe(self) -> str:
        return f"{self.dtype} activations, {self.quantization} weights, {self.kernels} kernels ({self.reason})"


def choose_numerics(
    dtype: str,
    quantization: str,
    batch_invariant: bool,
    cpu: CpuInfo,
    isas: tuple[str, ...] = (),
    gguf_checkpoint: bool = True,
) -> Numerics:
    """Resolve the flags against the CPU. `isas` lists the kernel instruction sets this CPU runs
    (engines.kernels.supported_isas()); it is only consulted when batch_invariant.
    `gguf_checkpoint`: the checkpoint is a GGUF file, whose quantized blocks `--quantization auto`
    serves by int-dot."""
    if dtype == AUTO_DTYPE:
        dtype, reason = _auto_dtype(batch_invariant, cpu)
    else:
        reason = f"--dtype {dtype}"
        if dtype == "bfloat16" and not cpu.has_native_bf16:
            reason += "; this CPU emulates bfloat16 arithmetic"
    if quantization == AUTO_QUANTIZATION:
        quantization, why = _auto_quantization(batch_invariant, gguf_checkpoint)
        reason += f"; {why}"
    if not batch_invariant:
        if quantization == INT_DOT:
            raise NumericsError("--quantization int-dot needs the batch-invariant kernels; drop --no-batch-invariant")
        return Numerics(dtype, quantization, False, None, reason)
    if dtype == "float16":
        raise NumericsError("--dtype float16 is not supported by the batch-invariant kernels; use --no-batch-invariant")
    isa = next((name for name in KERNEL_ISAS if name in isas), None)
    if isa is None:
        raise NumericsError("no batch-invariant kernel runs on this CPU; use --no-batch-invariant")
    return Numerics(dtype, quantization, True, isa, reason)


def _auto_quantization(batch_invariant: bool, gguf_checkpoint: bool) -> tuple[str, str]:
    if not batch_invariant:
        return "int8", "auto quantization: int8, torch's kernels have no integer dot products"
    if not gguf_checkpoint:
        return "int8", "auto quantization: int8, the checkpoint has no GGUF blocks"
    return INT_DOT, "auto quantization: int-dot, the GGUF's blocks by exact integer dot products"


def _auto_dtype(batch_invariant: bool, cpu: CpuInfo) -> tuple[str, str]:
    if batch_invariant:
        return "float32", "auto: the batch-invariant kernels compute in float32 on every CPU"
    if cpu.has_native_bf16:
        return "bfloat16", "auto: torch kernels, and this CPU has native bfloat16"
    return "float32", "auto: torch kernels, and this CPU has no native bfloat16"
