"""What every engine benchmark prints and builds the same way: the machine, and dpgate's engine
in a named configuration (the served default, or the same dtype and weights on torch's kernels)."""

from __future__ import annotations

import os


def describe_machine(with_torch: bool = True) -> str:
    """CPU model and the flags numerics are chosen by; with torch, its threads and kernel level
    (the gateway bench passes False: a gateway host needs no torch)."""
    from engines.kernels.cpu import cpu_info

    if not with_torch:
        return f"CPU: {cpu_info().describe()}; {os.cpu_count()} cores"
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    capped = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
    forced = {name: os.environ[name] for name in capped if name in os.environ}
    extra = f", forced {forced}" if forced else ""
    return f"CPU: {cpu_info().describe()}; {torch.get_num_threads()} torch threads, torch kernels {capability}{extra}"


def engine_numerics(batch_invariant: bool = True, isa: str | None = None, dtype: str = "auto", quantization="auto"):
    """dpgate's numerics as `dpgate engine` would choose them for a packaged GGUF served whole;
    `isa` caps the kernels' instruction set (e.g. "avx2" on an AVX-512 machine, to measure what an
    AVX2-only CPU would run)."""
    from engines import kernels
    from engines.kernels.cpu import cpu_info
    from engines.model.numerics import KERNEL_ISAS, choose_numerics

    isas = kernels.supported_isas() if batch_invariant else ()
    if isa is not None:
        if isa not in isas:
            raise SystemExit(f"--isa {isa}: this CPU's kernels run {', '.join(isas)}")
        isas = KERNEL_ISAS[KERNEL_ISAS.index(isa) :]
    return choose_numerics(dtype, quantization, batch_invariant, cpu_info(), isas)


def transformers_dtype(isa: str | None = None):
    """The dtype transformers runs fastest in: bfloat16 only where the CPU computes it natively
    (not when the bench emulates an AVX2-only CPU with `--isa avx2`)."""
    import torch

    from engines.kernels.cpu import cpu_info

    native = cpu_info().has_native_bf16 and isa not in ("avx2", "scalar")
    return torch.bfloat16 if native else torch.float32
