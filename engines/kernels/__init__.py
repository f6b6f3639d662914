"""The batch-invariant CPU kernels: linear, paged attention, RMS norm and the gated activation.

Each is a torch operator (`torch.ops.dpgate.*`) from a small C++ library built on this machine
(`engines/kernels/build.py`). What makes them batch invariant is stated once per kernel in its
header under csrc/ and in docs/engine.md: every output element is computed from its own row (its
own query, for attention) in one fixed order, so nothing about the rest of the batch, the tiling,
the thread split or the vector width can change its bits.

Every function takes `isa`, the instruction set to run: "scalar" (the reference, any CPU),
"avx2" or "avx512" (the matrix multiply and attention's value sums on sixteen lanes; the rest on
AVX2's eight, attention's scores with AVX-512's 32 registers), or "avx512_vnni" (AVX-512's
kernels, and vpdpbusd for the integer dot products of `IntDotWeight`; listed only after its
start-up self-check passed). All give the same bits. Which one the engine uses is decided once,
in engines/model/numerics.py.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import torch
import torch.nn.functional as F

from engines.kernels.build import KernelBuildError, build
from engines.kernels.gguf_blocks import GroupQuantized

__all__ = [
    "INT_DOT_BIAS",
    "PANEL_WIDTH",
    "IntDotWeight",
    "KernelBuildError",
    "PackedWeight",
    "QuantizedWeight",
    "act_and_mul",
    "attention",
    "attention_shard",
    "dcp_combine",
    "dcp_publish",
    "linear",
    "linear_weights",
    "load",
    "mask_rows",
    "pack_int_dot",
    "pack_quantized",
    "pack_weight",
    "quantize_activations",
    "rms_norm",
    "self_check",
    "signal_store",
    "signal_wait",
    "signal_wait_all",
    "supported_isas",
]

PANEL_WIDTH = 16  # output columns per packed weight panel (kPanelWidth in csrc/kernels.h)
INT_DOT_BIAS = 128  # signed byte codes q are stored as q + 128 for vpdpbusd's unsigned operand
# Instruction sets served only after their self-check passed (csrc/int_self_check.cpp).
_CHECKED_ISAS = ("avx512_vnni",)
logger = logging.getLogger(__name__)
_load_lock = threading.Lock()
_loaded = False
_usable_isas: tuple[str, ...] | None = None


def load() -> None:
    """Build the library if needed and register its operators; idempotent and thread safe."""
    global _loaded
    with _load_lock:
        if not _loaded:
            torch.ops.load_library(str(build()))
            _loaded = True


def _ops():
    """torch.ops.dpgate, loaded on first use."""
    if not _loaded:
        load()
    return torch.ops.dpgate


def supported_isas() -> tuple[str, ...]:
    """The instruction sets this CPU runs, from the slowest (the scalar reference) to the fastest:
    those its flags name, less any whose self-check failed (logged once a process)."""
    global _usable_isas
    if _usable_isas is None:
        _usable_isas = usable_isas(tuple(_ops().supported_isas()), self_check)
    return _usable_isas


def usable_isas(flagged: tuple[str, ...], check) -> tuple[str, ...]:
    """`flagged` less the sets in _CHECKED_ISAS whose `check(isa)` returns a reason; each one
    dropped is logged with its reason and the set served instead."""
    usable = []
    for isa in flagged:
        reason = check(isa) if isa in _CHECKED_ISAS else ""
        if reason:
            logger.warning(
                "dpgate kernels: the CPU reports %s but its self-check failed (%s); serving %s instead",
                isa, reason, usable[-1] if usable else "scalar",
            )  # fmt: skip
            continue
        usable.append(isa)
    return tuple(usable)


def self_check(isa: str, inject_fault: bool = False) -> str:
    """Run `isa`'s integer kernels on a fixed problem on this thread against the scalar
    reference: "" when the bits agree, else why not (an illegal instruction is caught).
    `inject_fault` changes one weight code for `isa`'s run (how the tests see a failure)."""
    return str(_ops().isa_self_check(isa, inject_fault))


class PackedWeight:
    """A linear layer's weight [N, K] laid out for the kernel: panels of 16 output columns,
    [ceil(N / 16), K, 16], zero padded; int8 weights carry float32 scales per output column
    (padded likewise). The values are exactly the weight's: packing only moves them."""

    __slots__ = ("in_features", "out_features", "panels", "scales")

    def __init__(self, panels: torch.Tensor, scales: torch.Tensor | None, out_features: int):
        self.panels = panels
        self.scales = scales
        self.out_features = out_features
        self.in_features = panels.shape[1]


def pack_weight(weight: torch.Tensor, scales: torch.Tensor | None = None) -> PackedWeight:
    """Pack `weight` [N, K] (int8 with `scales` [N], or bfloat16 / float32 without)."""
    if weight.dtype == torch.int8:
        if scales is None or scales.shape != weight.shape[:1]:
            raise ValueError("int8 weights need one scale per output row")
    elif weight.dtype not in (torch.float32, torch.bfloat16) or scales is not None:
        raise ValueError(f"cannot pack {weight.dtype} weights (with scales: {scales is not None})")
    out_features, in_features = weight.shape
    pad = -out_features % PANEL_WIDTH
    panels = F.pad(weight.detach(), (0, 0, 0, pad)) if pad else weight.detach()
    panels = panels.reshape(-1, PANEL_WIDTH, in_features).transpose(1, 2).contiguous()
    if scales is not None:
        scales = F.pad(scales.detach().float(), (0, pad)).contiguous()
    return PackedWeight(panels, scales, out_features)


class QuantizedWeight:
    """A block-quantized weight [N, K] laid out for csrc/quant_linear.h: codes as nibble pairs
    [P, K / 2, 16] uint8 (byte j of panel p at k / 2 holds column 16p+j's codes at the even k and
    k + 1) or int8 [P, K, 16], and
    float32 scales/offsets [P, K / group, 16], P = ceil(N / 16), zero padded. Packing moves the
    GroupQuantized's integers and floats without arithmetic, so the grid is the file's."""

    __slots__ = ("codes", "group", "in_features", "offsets", "out_features", "scales")

    def __init__(self, codes, scales, offsets, group: int, out_features: int):
        self.codes, self.scales, self.offsets, self.group = codes, scales, offsets, group
        self.out_features = out_features
        self.in_features = codes.shape[1] * (2 if codes.dtype == torch.uint8 else 1)

    @property
    def nbytes(self) -> int:
        parts = [self.codes, self.scales] + ([self.offsets] if self.offsets is not None else [])
        return sum(p.numel() * p.element_size() for p in parts)


def _panels(array: np.ndarray) -> np.ndarray:
    """[N, C] -> [ceil(N / 16), C, 16], rows zero padded to whole panels."""
    rows = array.shape[0]
    padded = np.zeros((-(-rows // PANEL_WIDTH) * PANEL_WIDTH, array.shape[1]), dtype=array.dtype)
    padded[:rows] = array
    return np.ascontiguousarray(padded.reshape(-1, PANEL_WIDTH, array.shape[1]).transpose(0, 2, 1))


def pack_quantized(weight: GroupQuantized) -> QuantizedWeight:
    """Lay a GroupQuantized out in the kernel's panels (see QuantizedWeight)."""
    codes = _panels(weight.codes)
    if weight.nibbles:
        codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
    offsets = None if weight.offsets is None else torch.from_numpy(_panels(weight.offsets))
    return QuantizedWeight(
        torch.from_numpy(np.ascontiguousarray(codes)), torch.from_numpy(_panels(weight.scales)), offsets,
        weight.group, weight.shape[0],
    )  # fmt: skip


class IntDotWeight:
    """A block-quantized weight [N, K] laid out for csrc/int_linear.h's integer dot products:
    unsigned codes u = q + bias (bias 0 for nibbles, INT_DOT_BIAS for signed bytes) in chunks of
    four along k per column, bytes [P, K / 4, 16 * 4] uint8 or nibbles [P, K / 8, 16 * 4] (the
    low nibble of a chunk's byte b is k = 8c + b, the high one 8c + 4 + b), and the
    GroupQuantized's float32 scales/offsets [P, K / group, 16]. Packing moves integers and
    floats without arithmetic, so the grid is the file's."""

    __slots__ = ("bias", "codes", "group", "in_features", "nibbles", "offsets", "out_features", "scales")

    def __init__(self, codes, scales, offsets, group: int, nibbles: bool, bias: int, out_features: int):
        self.codes, self.scales, self.offsets, self.group = codes, scales, offsets, group
        self.nibbles, self.bias, self.out_features = nibbles, bias, out_features
        self.in_features = codes.shape[1] * (8 if nibbles else 4)

    @property
    def nbytes(self) -> int:
        parts = [self.codes, self.scales] + ([self.offsets] if self.offsets is not None else [])
        return sum(p.numel() * p.element_size() for p in parts)


def pack_int_dot(weight: GroupQuantized) -> IntDotWeight:
    """Lay a GroupQuantized out for the integer kernels (see IntDotWeight); K must be a multiple
    of 32, the activations' group."""
    rows, columns = weight.shape
    if columns % 32:
        raise ValueError(f"integer dot products need K a multiple of 32, the weight has {columns}")
    if weight.nibbles:
        codes, bias = _panels(weight.codes), 0
        chunks = codes.reshape(codes.shape[0], columns // 8, 2, 4, PANEL_WIDTH)  # [P, chunk, half, b, column]
        packed = chunks[:, :, 0] | (chunks[:, :, 1] << 4)
    else:
        bias = INT_DOT_BIAS
        codes = _panels((weight.codes.astype(np.int16) + bias).astype(np.uint8))
        packed = codes.reshape(codes.shape[0], columns // 4, 4, PANEL_WIDTH)
    packed = np.ascontiguousarray(packed.transpose(0, 1, 3, 2)).reshape(packed.shape[0], packed.shape[1], -1)
    offsets = None if weight.offsets is None else torch.from_numpy(_panels(weight.offsets))
    return IntDotWeight(
        torch.from_numpy(packed), torch.from_numpy(_panels(weight.scales)), offsets, weight.group, weight.nibbles,
        bias, rows,
    )  # fmt: skip


def linear(x: torch.Tensor, weight: PackedWeight | QuantizedWeight | IntDotWeight, isa: str) -> torch.Tensor:
    """x [..., K] (float32 or bfloat16) @ weight.T -> [..., N] in x's dtype, accumulated in float32
    (IntDotWeight: activations quantized to int8 per row and 32 values, exact int32 sums)."""
    if isinstance(weight, IntDotWeight):
        return _ops().int_linear(
            x, weight.codes, weight.scales, weight.offsets, weight.group, weight.nibbles, weight.bias,
            weight.out_features, isa,
        )  # fmt: skip
    if isinstance(weight, QuantizedWeight):
        return _ops().quant_linear(
            x, weight.codes, weight.scales, weight.offsets, weight.group, weight.out_features, isa
        )  # fmt: skip
    return _ops().linear(x, weight.panels, weight.scales, weight.out_features, isa)


def quantize_activations(x: torch.Tensor, isa: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the integer kernels multiply, for tests: x float32 [M, K] (K a multiple of 32) ->
    codes int8 [M, K], scales float32 [M, K / 32], sums of the codes per 16 int32 [M, K / 16]
    (csrc/int_linear.h states the rule)."""
    return _ops().int_quantize(x, isa)


def linear_weights(parts: list[PackedWeight | QuantizedWeight | IntDotWeight]) -> torch.ScriptObject:
    """One linear layer's row parts as a torch.classes.dpgate.LinearWeights: `.forward(x, isa)`
    runs them into one output (each part its own columns, no concatenation), and the fused
    decoder layer (engines/model/fused.py) runs them from C++."""
    _ops()
    weights = torch.classes.dpgate.LinearWeights(parts[0].in_features)
    for part in parts:
        if isinstance(part, IntDotWeight):
            weights.add_int_dot(
                part.codes, part.scales, part.offsets, part.group, part.nibbles, part.bias, part.out_features
            )  # fmt: skip
        elif isinstance(part, QuantizedWeight):
            weights.add_quantized(part.codes, part.scales, part.offsets, part.group, part.out_features)
        else:
            weights.add_packed(part.panels, part.scales, part.out_features)
    return weights


def attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    token_seq: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    scale: float,
    window: int | None,
    isa: str,
) -> torch.Tensor:
    """Causal paged attention, one query at a time. q [T, H, D]; caches [KVH, slots, D];
    block_tables [seqs, blocks] int32; token_seq [T] int32 (each query's row of block_tables);
    positions [T] int64. Returns [T, H, D] in q's dtype."""
    out, _ = _ops().attention(
        q, key_cache, value_cache, block_tables, token_seq, positions, block_size, scale, window or 0, isa, 1, 0, 1,
        False,
    )  # fmt: skip
    return out


def attention_shard(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    token_seq: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    scale: float,
    window: int | None,
    dcp_size: int,
    dcp_rank: int,
    interleave: int,
    isa: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the keys this decode-context-parallel rank holds (position p lives on rank
    (p // interleave) % dcp_size; block tables count logical blocks of block_size * dcp_size
    positions). Returns the normalized partial output [T, H, D] and its natural-log LSE [T, H],
    float32 (-inf, with zeros, where the rank holds none of a query's keys)."""
    return _ops().attention(
        q, key_cache, value_cache, block_tables, token_seq, positions, block_size, scale, window or 0, isa,
        dcp_size, dcp_rank, interleave, True,
    )  # fmt: skip


def dcp_combine(
    outs: torch.Tensor, lses: torch.Tensor, num_tokens: int, head_offset: int, num_heads: int, isa: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine C ranks' partial attention: outs [C, tokens, heads, D], lses [C, tokens, heads]
    (float32), rows 0..num_tokens-1 of heads head_offset..head_offset+num_heads-1. Returns the
    output [num_tokens, num_heads, D] and LSE [num_tokens, num_heads] (csrc/dcp.h states the rule)."""
    return _ops().dcp_combine(outs, lses, num_tokens, head_offset, num_heads, isa)


def signal_store(flags: torch.Tensor, index: int, value: int) -> None:
    """flags[index] = value (int64, shared memory) with release order: what this process wrote
    before is visible to whoever sees the value."""
    _ops().signal_store(flags, index, value)


def signal_wait(flags: torch.Tensor, index: int, value: int, timeout_s: float) -> bool:
    """Wait (spinning, then yielding) until flags[index] == value, with acquire order; False on timeout."""
    return _ops().signal_wait(flags, index, value, timeout_s)


def signal_wait_all(flags: torch.Tensor, first: int, stride: int, count: int, value: int, timeout_s: float) -> int:
    """Wait until flags[first + k * stride] == value for every k < count; the first k that timed
    out, or -1."""
    return _ops().signal_wait_all(flags, first, stride, count, value, timeout_s)


def dcp_publish(out: torch.Tensor, lse: torch.Tensor, out_slot: torch.Tensor, lse_slot: torch.Tensor) -> None:
    """Copy every row's LSE, and the output rows that have keys, into this rank's exchange slot."""
    _ops().dcp_publish(out, lse, out_slot, lse_slot)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, isa: str) -> torch.Tensor:
    """x / rms(x) * weight over the last dimension; `weight` float32 (Gemma's 1 + w already added)."""
    return _ops().rms_norm(x, weight, eps, isa)


def mask_rows(
    logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor, out: torch.Tensor, vocab_size: int
) -> None:
    """out[j] = logits[rows[j]] with -inf where bitmask[j] (int32 words, bit t % 32 of word t // 32)
    clears token t: the copy and the mask in one pass (engines/grammar/bitmask.py says why)."""
    _ops().mask_rows(logits, rows, bitmask, out, vocab_size)


def act_and_mul(x: torch.Tensor, activation: str, isa: str) -> torch.Tensor:
    """x [..., 2I] = gate | up -> activation(gate) * up [..., I]; activation "silu" or "gelu_tanh"."""
    return _ops().act_and_mul(x, activation, isa)
