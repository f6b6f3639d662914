"""The integer dot-product kernels (`--quantization int-dot`, csrc/int_linear.h).

Activations are quantized per row and per 32 values to int8 codes by a rule written out again
here in numpy (float32 operations, each exactly rounded), and every instruction set's codes,
scales and sums equal it exactly. The weight codes times those activation codes are integers
computed here exactly (int64), so the expected output is a float64 sum of known terms; the
kernel's fixed float32 chain over them is bounded by (groups + 3) * 2^-24 * sum |terms| (every
fma of the chain and the two roundings of each term lose at most 2^-24 of what they add up).
For every GGUF format served, every instruction set this CPU runs gives the same bits, a row's
result never depends on the other rows, and an instruction set whose self-check fails is left
out with a log line.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engines import kernels
from engines.kernels.gguf_blocks import SUPPORTED, GroupQuantized, decode
from engines.model.kernel_layers import KernelLinear
from engines.model.weights import merge_alike
from tests.engines.kernels.test_quant_kernels import assert_rows_batch_invariant_and_alike, random_blocks

ISAS = kernels.supported_isas()
U = 2.0**-24
FLT_MIN = np.float32(np.finfo(np.float32).tiny)


def quantize_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The activation rule in numpy float32: codes int8 [M, K], scales [M, K / 32], sums [M, K / 16]."""
    rows, columns = x.shape
    groups = x.reshape(rows, columns // 32, 32).astype(np.float32)
    amax = np.abs(groups).max(axis=2)
    normal = amax >= FLT_MIN
    safe = np.where(normal, amax, np.float32(1))
    scales = np.where(normal, safe / np.float32(127), np.float32(0)).astype(np.float32)
    inverse = (np.float32(127) / safe).astype(np.float32)
    rounded = np.rint((groups * inverse[..., None]).astype(np.float32))  # rint: ties to even
    codes = np.where(normal[..., None], np.clip(rounded, -127, 127), 0).astype(np.int8).reshape(rows, columns)
    sums = codes.reshape(rows, columns // 16, 16).sum(axis=2, dtype=np.int32)
    return codes, scales, sums


def expected_and_bound(x: np.ndarray, weight: GroupQuantized) -> tuple[np.ndarray, np.ndarray]:
    """float64 y = sum over weight groups j of s * (D_j * i_j + M_j * sum_j a), with the exact
    integers i_j, and the bound on the float32 chain's rounding."""
    codes, scales, _ = quantize_reference(x)
    rows, columns = codes.shape
    group = weight.group
    n_groups = columns // group
    a = codes.astype(np.int64).reshape(rows, n_groups, group)
    q = weight.codes.astype(np.int64).reshape(-1, n_groups, group)
    integers = np.einsum("mjg,njg->mnj", a, q).astype(np.float64)  # exact: |i| < 2^21
    act_sums = a.sum(axis=2).astype(np.float64)  # [M, groups]
    act_scales = np.repeat(scales.astype(np.float64), 32 // group, axis=1)  # per weight group
    d = weight.scales.astype(np.float64)
    terms = d[None] * integers
    magnitudes = np.abs(terms)
    if weight.offsets is not None:
        offset_terms = weight.offsets.astype(np.float64)[None] * act_sums[:, None, :]
        terms = terms + offset_terms
        magnitudes = magnitudes + np.abs(offset_terms)
    expected = (act_scales[:, None, :] * terms).sum(axis=2)
    bound = (n_groups + 3) * U * 1.01 * (act_scales[:, None, :] * magnitudes).sum(axis=2)
    return expected, bound


def ties_and_edges(columns: int, seed: int) -> torch.Tensor:
    """Random rows, with groups that test the rule's edges in row 0: exact halves (amax 127,
    so x * 127 / amax is x), all zeros, only subnormals, and one value far above the rest."""
    x = torch.randn(7, columns, generator=torch.Generator().manual_seed(seed))
    x[0, :32] = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5] + [3.0] * 24)
    x[0, 32:64] = 0.0
    x[0, 64:96] = 1e-40
    x[0, 96:128] = 1e-3
    x[0, 100] = 1e4
    return x


def test_activation_codes_follow_the_rule_exactly_on_every_isa():
    x = ties_and_edges(256, seed=1)
    codes, scales, sums = quantize_reference(x.numpy())
    assert codes[0, :8].tolist() == [127, 0, 2, 2, 0, -2, -2, 126]  # ties to even
    assert scales[0, 1] == 0 and scales[0, 2] == 0 and not codes[0, 32:96].any()
    error = np.abs(np.repeat(scales, 32, axis=1) * codes - x.numpy())
    assert (error <= np.repeat(scales, 32, axis=1) * 0.5 * (1 + 1e-5) + 1e-39).all()
    for isa in ISAS:
        got = kernels.quantize_activations(x, isa)
        assert np.array_equal(got[0].numpy(), codes), isa
        assert np.array_equal(got[1].numpy(), scales), isa
        assert np.array_equal(got[2].numpy(), sums), isa


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda q: q.name)
def test_the_kernel_is_the_exact_integer_sums_through_one_float32_chain(qtype):
    rows, columns = 100, 512  # 100 output columns: the last panel is padded
    weight = decode(random_blocks(qtype, rows, columns, seed=2), qtype, (rows, columns))
    packed = kernels.pack_int_dot(weight)
    x = ties_and_edges(columns, seed=3)
    expected, bound = expected_and_bound(x.numpy(), weight)
    dense = weight.dequantize().astype(np.float64)
    codes, scales, _ = quantize_reference(x.numpy())
    quantization_error = np.abs(np.repeat(scales, 32, axis=1) * codes - x.numpy()) @ np.abs(dense).T
    weight_rounding = U * (np.abs(x.double().numpy()) @ np.abs(dense).T)  # dequantize() rounds D * q + M once
    results = {isa: kernels.linear(x, packed, isa) for isa in ISAS}
    for isa, y in results.items():
        assert torch.equal(y, results["scalar"]), isa
        assert (np.abs(y.numpy() - expected) <= bound).all(), isa
        # Against the unquantized product: the activations' rounding (at most s / 2 each) on top.
        limit = bound + quantization_error * 1.0001 + weight_rounding
        assert (np.abs(y.numpy() - x.double().numpy() @ dense.T) <= limit).all(), isa
        # bfloat16 activations: widened to float32, the same chain, the output rounded once.
        widened = kernels.linear(x.bfloat16().float(), packed, isa).bfloat16()
        assert torch.equal(kernels.linear(x.bfloat16(), packed, isa), widened), isa


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q4_K, Q.Q5_0, Q.Q8_0, Q.Q6_K], ids=lambda q: q.name)
def test_rows_are_batch_invariant_and_alike_on_every_isa(qtype):
    """Every register tile of every instruction set (1, 2 and 4 rows, with their remainders) is
    met by some batch size up to 16; a row's bits never change."""
    rows, columns = 200, 256
    weight = decode(random_blocks(qtype, rows, columns, seed=4), qtype, (rows, columns))
    packed = kernels.pack_int_dot(weight)
    assert_rows_batch_invariant_and_alike(packed, torch.randn(16, columns, generator=torch.Generator().manual_seed(5)))


@pytest.mark.parametrize("nibbles", [True, False], ids=["nibbles", "signed-bytes"])
@pytest.mark.parametrize("group", [16, 32])
def test_the_largest_products_sum_exactly_on_every_isa(nibbles, group):
    """The int16 routes of int_linear.h (vpmaddubsw on AVX2, and for nibbles on AVX-512) meet
    their bound: codes at their extremes (15; -128 and 127) times activation codes of +-127 in
    every position, so every int16 lane holds the largest sum it can, of either sign."""
    rows, columns = 32, 256
    if nibbles:
        codes = np.full((rows, columns), 15, np.uint8)
    else:
        codes = np.full((rows, columns), -128, np.int8)
        codes[1::2] = 127
    weight = GroupQuantized(codes, np.ones((rows, columns // group), np.float32), None, group, nibbles)
    packed = kernels.pack_int_dot(weight)
    x = torch.ones(4, columns)
    x[1] = -1.0
    x[2, 1::2] = -1.0  # alternating signs: lanes that cancel
    x[3, :128] = -1.0
    expected, bound = expected_and_bound(x.numpy(), weight)
    assert (np.abs(quantize_reference(x.numpy())[0]) == 127).all()  # the premise: extreme codes
    for isa in ISAS:
        y = kernels.linear(x, packed, isa)
        assert torch.equal(y, kernels.linear(x, packed, "scalar")), isa
        assert (np.abs(y.numpy() - expected) <= bound).all(), isa


def test_a_row_holding_inf_or_nan_spoils_its_own_outputs_only():
    weight = decode(random_blocks(Q.Q8_0, 32, 128, seed=6), Q.Q8_0, (32, 128))
    packed = kernels.pack_int_dot(weight)
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(7))
    x[1, 40], x[2, 3] = float("inf"), float("nan")
    for isa in ISAS:
        y = kernels.linear(x, packed, isa)
        assert not torch.isfinite(y[1:3]).any(), isa
        for r in (0, 3):
            assert torch.equal(y[r], kernels.linear(x[r : r + 1], packed, isa)[0]), isa


def test_a_layer_of_two_formats_gives_each_parts_own_bits():
    """A fused qkv of Q5_0 and Q8_0 parts (as Gemma 3 ships some): one quantization of the input
    serves both parts, and each writes its own columns."""
    q = decode(random_blocks(Q.Q5_0, 48, 128, seed=8), Q.Q5_0, (48, 128))
    v = decode(random_blocks(Q.Q4_1, 40, 128, seed=9), Q.Q4_1, (40, 128))
    parts = merge_alike([q, v])
    assert len(parts) == 2
    layer = KernelLinear(torch.nn.Linear(128, 88, bias=False), "int-dot", ISAS[-1], parts, int_dot=True)
    assert layer.storage == "gguf/int-dot"
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(10))
    expected = torch.cat([kernels.linear(x, kernels.pack_int_dot(p), ISAS[-1]) for p in parts], dim=1)
    assert torch.equal(layer(x), expected)


def test_every_isa_passes_its_self_check_and_a_fault_is_caught():
    for isa in ISAS:
        assert kernels.self_check(isa) == "", isa
        assert "differ from the scalar reference" in kernels.self_check(isa, inject_fault=True), isa


def test_an_isa_whose_self_check_fails_is_left_out_with_a_log_line(caplog):
    flagged = ("scalar", "avx2", "avx512", "avx512_vnni")
    if "avx512_vnni" in ISAS:  # the real check, made to fail

        def check(isa):
            return kernels.self_check(isa, inject_fault=True)
    else:  # no VNNI here: a check that fails as an illegal instruction would

        def check(isa):
            return "an illegal instruction (SIGILL)"

    with caplog.at_level(logging.WARNING, logger="engines.kernels"):
        assert kernels.usable_isas(flagged, check) == ("scalar", "avx2", "avx512")
    assert "reports avx512_vnni but its self-check failed" in caplog.text
    assert "serving avx512 instead" in caplog.text
    with caplog.at_level(logging.WARNING, logger="engines.kernels"):
        assert kernels.usable_isas(flagged, lambda isa: "") == flagged


def test_bad_weights_are_refused_with_the_rule():
    with pytest.raises(ValueError, match="K a multiple of 32, the weight has 48"):
        kernels.pack_int_dot(GroupQuantized(np.zeros((16, 48), np.int8), np.ones((16, 3), np.float32), None, 16, False))
    packed = kernels.pack_int_dot(decode(random_blocks(Q.Q8_0, 16, 64), Q.Q8_0, (16, 64)))
    with pytest.raises(RuntimeError, match="code bias must be 0 for nibbles, 0 or 128 for bytes"):
        torch.ops.dpgate.int_linear(torch.randn(2, 64), packed.codes, packed.scales, None, 32, False, 7, 16, "scalar")
    with pytest.raises(RuntimeError, match="input has 32 features, weights 64"):
        kernels.linear(torch.randn(2, 32), packed, "scalar")
