"""A GGUF tensor's quantized blocks as integer codes and per-group scales, without a float round trip.

Every format served as shipped dequantizes, in the `gguf` package's reference code, to
w = D * q + M in float32: q a small integer code, D and M one pair per group of `group` weights
along a row (the input dimension). D * q is exact in float32 (an fp16 scale, or fp16 times a 6- or
8-bit sub-scale, times a code of at most 6 bits), so the sum with M is the only rounding, and
fma(D, q, M) gives the reference's weight bit for bit. This module reads the raw block bytes with
numpy bit operations into that form (`GroupQuantized`); engines/kernels packs it for the kernel.

| format | group | code q | D | M |
|---|---|---|---|---|
| Q4_0 | 32 | nibble 0..15 | d | -8 d |
| Q4_1 | 32 | nibble 0..15 | d | m |
| Q5_0 | 32 | int8: 5-bit - 16 | d | none |
| Q8_0 | 32 | int8 | d | none |
| Q4_K | 32 | nibble 0..15 | d * sc | -(dmin * m) |
| Q6_K | 16 | int8: 6-bit - 32 | d * sc | none |

Q4_0's -8 d makes d * q - 8 d = d * (q - 8) exactly (both sides are exact), except that a zero
weight under a negative d is +0 here and -0 in the reference, which no fma chain from +0 can tell
apart. Other formats have no kernel here (`SUPPORTED` lists these).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
SUPPORTED = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K)


@dataclass(frozen=True, slots=True)
class GroupQuantized:
    """Weights [N, K] as w = scales * codes + offsets, one scale/offset per `group` columns.

    codes: uint8 [N, K] (nibbles 0..15) when `nibbles`, else int8 [N, K]; scales and offsets
    float32 [N, K / group] (offsets None for M = 0). Row operations (concatenation, permutation,
    slicing) and column slices on group boundaries keep the grid exact."""

    codes: np.ndarray
    scales: np.ndarray
    offsets: np.ndarray | None
    group: int
    nibbles: bool

    @property
    def kind(self) -> tuple[int, bool, bool]:
        """What the kernel's layout depends on: group size, nibbles, offsets present."""
        return self.group, self.nibbles, self.offsets is not None

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    def dequantize(self) -> np.ndarray:
        """float32 [N, K]: each weight rounded once, as the reference rounds it."""
        expanded = np.repeat(self.scales, self.group, axis=1) * self.codes.astype(np.float32)  # exact
        if self.offsets is not None:
            expanded += np.repeat(self.offsets, self.group, axis=1)
        return expanded

    def rows(self, index: np.ndarray | slice) -> GroupQuantized:
        """The rows `index` selects (a slice or an index array), copied."""
        offsets = None if self.offsets is None else self.offsets[index].copy()
        return GroupQuantized(self.codes[index].copy(), self.scales[index].copy(), offsets, self.group, self.nibbles)

    def columns(self, start: int, stop: int) -> GroupQuantized:
        """Input columns start..stop, which must lie on group boundaries."""
        if start % self.group or stop % self.group:
            raise ValueError(f"columns {start}..{stop} do not lie on {self.group}-weight group boundaries")
        first, last = start // self.group, stop // self.group
        offsets = None if self.offsets is None else self.offsets[:, first:last].copy()
        return GroupQuantized(
            self.codes[:, start:stop].copy(), self.scales[:, first:last].copy(), offsets, self.group, self.nibbles
        )


def concatenate(parts: list[GroupQuantized]) -> GroupQuantized:
    """Stack along rows (N); the parts must share group size, code kind and having offsets."""
    first = parts[0]
    if any(p.kind != first.kind for p in parts):
        raise ValueError("cannot concatenate differently quantized tensors")
    offsets = None if first.offsets is None else np.concatenate([p.offsets for p in parts])
    return GroupQuantized(
        np.concatenate([p.codes for p in parts]), np.concatenate([p.scales for p in parts]), offsets, first.group,
        first.nibbles,
    )  # fmt: skip


def decode(raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int]) -> GroupQuantized:
    """A 2-D tensor's raw block bytes (numpy shape [N, K]) as a GroupQuantized."""
    if qtype not in SUPPORTED:
        raise ValueError(f"no kernel for {qtype.name} weights")
    rows, columns = shape
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = np.asarray(raw, dtype=np.uint8).reshape(rows * columns // block_size, type_size)
    codes, scales, offsets, group = _DECODERS[qtype](blocks)
    codes = codes.reshape(rows, columns)
    scales = scales.astype(np.float32).reshape(rows, columns // group)
    if offsets is not None:
        offsets = offsets.astype(np.float32).reshape(rows, columns // group)
    return GroupQuantized(codes, scales, offsets, group, codes.dtype == np.uint8)


def _fp16(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles32(packed: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32] codes: weights 0..15 the low nibbles, 16..31 the high ones."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=1)


def _q4_0(blocks):
    d = _fp16(blocks, 0)
    return _nibbles32(blocks[:, 2:18]), d, -8 * d, 32


def _q4_1(blocks):
    return _nibbles32(blocks[:, 4:20]), _fp16(blocks, 0), _fp16(blocks, 2), 32


def _q5_0(blocks):
    high = blocks[:, 2:6].copy().view("<u4")  # bit j: weight j's fifth bit
    fifth = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    codes = (_nibbles32(blocks[:, 6:22]) | (fifth << 4)).astype(np.int8) - np.int8(16)
    return codes, _fp16(blocks, 0), None, 32


def _q8_0(blocks):
    return blocks[:, 2:34].copy().view(np.int8), _fp16(blocks, 0), None, 32


def _q4_k(blocks):
    # 256 weights: d, dmin (fp16), 12 bytes of eight 6-bit scales and mins, 128 bytes of nibbles.
    d, dmin = _fp16(blocks, 0), _fp16(blocks, 2)
    packed = blocks[:, 4:16]
    low, high, mixed = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([low & 0x3F, (mixed & 0x0F) | ((low >> 2) & 0x30)], axis=1)
    mins = np.concatenate([high & 0x3F, (mixed >> 4) | ((high >> 2) & 0x30)], axis=1)
    chunks = blocks[:, 16:144].reshape(-1, 4, 32)  # chunk c: sub-blocks 2c (low) and 2c + 1 (high)
    codes = np.stack([chunks & 0x0F, chunks >> 4], axis=2).reshape(-1, 256)
    return codes, d * sc.astype(np.float32), -(dmin * mins.astype(np.float32)), 32


def _q6_k(blocks):
    # 256 weights: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d (fp16).
    low = blocks[:, 0:128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    low = (low & 0x0F).reshape(-1, 8, 32)
    high = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = (high & 0x03).reshape(-1, 8, 32)
    codes = (low | (high << 4)).astype(np.int8).reshape(-1, 256) - np.int8(32)
    sc = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)
    return codes, _fp16(blocks, 208) * sc, None, 16


_DECODERS = {Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q5_0: _q5_0, Q.Q8_0: _q8_0, Q.Q4_K: _q4_k, Q.Q6_K: _q6_k}
