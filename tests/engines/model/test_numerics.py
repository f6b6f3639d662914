"""The served numerics are chosen by the CPU in one place (engines/model/numerics.py): a pure function
of the flags and the CPU's features, checked here for each kind of machine without needing one."""

from __future__ import annotations

import pytest

from engines.kernels.cpu import CpuInfo, parse_cpuinfo
from engines.model.numerics import NumericsError, choose_numerics

ZEN3 = CpuInfo("AMD EPYC 7B13", frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"}))
ZEN4 = CpuInfo("AMD EPYC 9B14", frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16"}))
SAPPHIRE_RAPIDS = CpuInfo("Intel Xeon", frozenset({"avx2", "fma", "avx512f", "avx512bw", "amx_bf16", "amx_tile"}))
OLD = CpuInfo("Intel Xeon E5", frozenset({"sse4_2", "avx"}))


@pytest.mark.parametrize(
    ("cpu", "isas", "isa"),
    [(ZEN3, ("scalar", "avx2"), "avx2"), (ZEN4, ("scalar", "avx2", "avx512"), "avx512"), (OLD, ("scalar",), "scalar")],
)
def test_the_served_default_is_float32_over_int_dot_on_the_widest_kernel(cpu, isas, isa):
    numerics = choose_numerics("auto", "auto", True, cpu, isas)
    assert (numerics.dtype, numerics.quantization, numerics.batch_invariant, numerics.isa) == (
        "float32",
        "int-dot",
        True,
        isa,
    )
    assert numerics.kernels == f"batch-invariant/{isa}"
    assert "float32 activations, int-dot weights" in numerics.describe()
    assert "auto quantization: int-dot" in numerics.describe()


def test_auto_quantization_serves_int8_without_gguf_blocks_or_batch_invariant_kernels():
    safetensors = choose_numerics("auto", "auto", True, ZEN4, ("scalar", "avx2", "avx512"), gguf_checkpoint=False)
    assert safetensors.quantization == "int8"
    assert "the checkpoint has no GGUF blocks" in safetensors.reason
    torch_kernels = choose_numerics("auto", "auto", False, ZEN4)
    assert torch_kernels.quantization == "int8"
    assert "torch's kernels have no integer dot products" in torch_kernels.reason
    # An explicit choice is never replaced.
    assert choose_numerics("auto", "int8", True, ZEN4, ("scalar", "avx2")).quantization == "int8"
    explicit = choose_numerics("auto", "gguf", True, ZEN4, ("scalar", "avx2"), gguf_checkpoint=False)
    assert explicit.quantization == "gguf"


@pytest.mark.parametrize(("cpu", "dtype"), [(ZEN3, "float32"), (ZEN4, "bfloat16"), (SAPPHIRE_RAPIDS, "bfloat16")])
def test_torch_kernels_take_bfloat16_only_where_the_cpu_computes_it_natively(cpu, dtype):
    numerics = choose_numerics("auto", "int8", False, cpu)
    assert (numerics.dtype, numerics.batch_invariant, numerics.isa, numerics.kernels) == (dtype, False, None, "torch")


def test_an_explicit_dtype_always_wins_and_says_when_it_is_emulated():
    assert choose_numerics("bfloat16", "int8", True, ZEN3, ("scalar", "avx2")).dtype == "bfloat16"
    assert "emulates bfloat16" in choose_numerics("bfloat16", "none", False, ZEN3).reason
    assert choose_numerics("float32", "none", False, ZEN4).dtype == "float32"


def test_float16_needs_torch_kernels():
    with pytest.raises(NumericsError, match="--dtype float16 is not supported by the batch-invariant kernels"):
        choose_numerics("float16", "int8", True, ZEN4, ("scalar", "avx2"))
    assert choose_numerics("float16", "int8", False, ZEN4).dtype == "float16"


def test_cpuinfo_parsing_takes_the_first_processor():
    text = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma\n\n"
    text += "processor\t: 1\nmodel name\t: other\n"
    cpu = parse_cpuinfo(text)
    assert (cpu.model, cpu.has_avx2, cpu.has_avx512, cpu.has_native_bf16) == ("AMD EPYC 7B13", True, False, False)
    assert cpu.describe() == "AMD EPYC 7B13 (AVX2 yes, FMA yes, AVX-512 no, AVX512-BF16 no, AMX no)"


def test_int_dot_needs_the_batch_invariant_kernels_and_takes_vnni_where_it_passed_its_check():
    with pytest.raises(NumericsError, match="--quantization int-dot needs the batch-invariant kernels"):
        choose_numerics("auto", "int-dot", False, ZEN4)
    isas = ("scalar", "avx2", "avx512", "avx512_vnni")
    numerics = choose_numerics("auto", "int-dot", True, ZEN4, isas)
    assert (numerics.quantization, numerics.kernels) == ("int-dot", "batch-invariant/avx512_vnni")
    # avx512_vnni is avx512's code outside the integer kernels: the default takes it too, and
    # without it (a CPU without the flag, or a failed self-check) avx512 serves.
    assert choose_numerics("auto", "int8", True, ZEN4, isas).isa == "avx512_vnni"
    assert choose_numerics("auto", "int-dot", True, ZEN4, isas[:3]).isa == "avx512"
