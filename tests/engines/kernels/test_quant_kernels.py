"""The GGUF block kernel (`--quantization gguf`): the file's grid served exactly and batch invariantly.

For every quant type the two packaged models ship (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), random
blocks (made by the gguf package's quantize where it has one, else random bytes with finite fp16
scales) decode to the gguf package's dequantized weights exactly; the kernel's output equals our
float32 kernel over those dequantized weights bit for bit on every instruction set this CPU runs
(so the float64 reference bounds it like any float32 fma chain: |y - y64| <= K u sum|x w|, u =
2^-24, since the weights themselves carry no error); and a row's result never depends on the
other rows (rows alone vs in batches of 1..16, chunked as prefill splits would, every ISA alike).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from torch import nn

from engines import kernels
from engines.kernels.gguf_blocks import SUPPORTED, decode
from engines.model.kernel_layers import KernelLinear
from engines.model.weights import merge_alike

ISAS = kernels.supported_isas()
FP16_FIELDS = {Q.Q4_K: (0, 2), Q.Q6_K: (208,)}  # byte offsets of the fp16 super-block scales


def random_blocks(qtype: Q, rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """Raw GGUF bytes [rows, row bytes] of a random [rows, columns] tensor in `qtype`."""
    rng = np.random.default_rng(seed)
    if qtype not in FP16_FIELDS:
        return quantize((rng.standard_normal((rows, columns)) * columns**-0.5).astype(np.float32), qtype)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows * columns // block_size, type_size), dtype=np.uint8)
    for at in FP16_FIELDS[qtype]:  # random scale bytes could be inf or NaN; keep them finite
        raw[:, at : at + 2] = (rng.standard_normal((raw.shape[0], 1)) * 0.002).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def reference(raw: np.ndarray, qtype: Q, rows: int, columns: int) -> torch.Tensor:
    return torch.from_numpy(dequantize(raw, qtype).reshape(rows, columns).astype(np.float32))


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda q: q.name)
def test_decoded_blocks_are_the_gguf_packages_weights_exactly(qtype):
    rows, columns = 40, 512
    raw = random_blocks(qtype, rows, columns)
    decoded = decode(raw, qtype, (rows, columns))
    assert np.array_equal(decoded.dequantize(), reference(raw, qtype, rows, columns).numpy())
    assert decoded.nibbles == (qtype in (Q.Q4_0, Q.Q4_1, Q.Q4_K))


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda q: q.name)
def test_the_kernel_is_the_float32_kernel_on_the_dequantized_grid(qtype):
    rows, columns = 100, 512  # 100 output columns: the last panel is padded
    raw = random_blocks(qtype, rows, columns, seed=1)
    dense = reference(raw, qtype, rows, columns)
    packed = kernels.pack_quantized(decode(raw, qtype, (rows, columns)))
    x = torch.randn(19, columns, generator=torch.Generator().manual_seed(2))
    exact = x.double() @ dense.double().T
    bound = columns * 2.0**-24 * (x.double().abs() @ dense.double().abs().T)
    for isa in ISAS:
        y = kernels.linear(x, packed, isa)
        assert torch.equal(y, kernels.linear(x, kernels.pack_weight(dense), isa)), isa
        assert bool(((y.double() - exact).abs() <= bound).all()), isa
        bf16 = x.bfloat16()
        assert torch.equal(kernels.linear(bf16, packed, isa), kernels.linear(bf16, kernels.pack_weight(dense), isa))


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q6_K], ids=lambda q: q.name)
def test_rows_are_batch_invariant_and_alike_on_every_isa(qtype):
    """Nibbles with offsets (Q4_1), bytes (Q8_0) and 16-weight groups (Q6_K): every register-tile
    shape of every ISA, and the GEMM-shaped path from 8 rows with its partial row tiles, is met by
    some batch size up to 16."""
    rows, columns = 200, 256
    packed = kernels.pack_quantized(decode(random_blocks(qtype, rows, columns, seed=3), qtype, (rows, columns)))
    assert_rows_batch_invariant_and_alike(packed, torch.randn(16, columns, generator=torch.Generator().manual_seed(4)))


def assert_rows_batch_invariant_and_alike(packed, x: torch.Tensor) -> None:
    """Each row of `x` through `packed` gives the same bits alone, in every leading batch of 1..len(x)
    rows and in uneven chunks, on every instruction set the machine has, and the same as scalar."""
    alone = {isa: torch.cat([kernels.linear(x[r : r + 1], packed, isa) for r in range(len(x))]) for isa in ISAS}
    for isa in ISAS:
        assert torch.equal(alone[isa], alone["scalar"]), isa
        for m in range(1, len(x) + 1):
            assert torch.equal(kernels.linear(x[:m], packed, isa), alone[isa][:m]), (isa, m)
        cuts = (0, 3, 12, len(x))
        chunks = torch.cat([kernels.linear(x[a:b], packed, isa) for a, b in itertools.pairwise(cuts)])
        assert torch.equal(chunks, alone[isa]), isa


def test_a_layer_fused_from_two_formats_is_served_part_by_part_with_the_same_bits():
    gate = decode(random_blocks(Q.Q4_1, 48, 128, seed=5), Q.Q4_1, (48, 128))
    up = decode(random_blocks(Q.Q8_0, 40, 128, seed=6), Q.Q8_0, (40, 128))
    parts = merge_alike([gate, up])
    assert len(parts) == 2
    dense = torch.from_numpy(np.concatenate([gate.dequantize(), up.dequantize()]))
    layer = KernelLinear(nn.Linear(128, 88, bias=False), "gguf", ISAS[-1], parts)
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(7))
    assert torch.equal(layer(x), kernels.linear(x, kernels.pack_weight(dense), ISAS[-1]))


def test_bad_shapes_are_refused_with_the_rule():
    packed = kernels.pack_quantized(decode(random_blocks(Q.Q4_1, 16, 64), Q.Q4_1, (16, 64)))
    with pytest.raises(RuntimeError, match="input has 32 features, weights 64"):
        kernels.linear(torch.randn(2, 32), packed, "scalar")
    with pytest.raises(ValueError, match="group boundaries"):
        decode(random_blocks(Q.Q4_1, 16, 64), Q.Q4_1, (16, 64)).columns(0, 48)
