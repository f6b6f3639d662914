"""Decode context parallelism's attention math against a dense float64 reference: each of C ranks
attends over the keys it holds (position p on rank (p // I) % C) and returns a partial output and
its LSE; the combine (csrc/dcp.h) must equal attention over all keys. Shards may be empty (fewer
tokens than ranks, windows), rows may be padding, and slots that must not be read hold NaN."""

from __future__ import annotations

import math

import pytest
import torch

from engines import kernels

ISAS = kernels.supported_isas()
FAST = [isa for isa in ISAS if isa != "scalar"][-1:] or ["scalar"]


def dense_reference(q, keys, values, positions, scale, window=None):
    """float64 attention of q [T, H, D] over keys/values [L, D] (one kv head), causal by position."""
    q, keys, values = q.double(), keys.double(), values.double()
    key_positions = torch.arange(keys.shape[0])
    visible = key_positions[None, :] <= positions[:, None]
    if window:
        visible &= positions[:, None] - key_positions[None, :] < window
    scores = torch.einsum("thd,ld->thl", q, keys) * scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.einsum("thl,ld->thd", scores.softmax(-1), values), lse


class ShardedSequence:
    """One sequence's keys and values spread over C ranks' caches, as the engine lays them out."""

    def __init__(self, length, C, interleave, block_size=16, head_dim=64, num_blocks=64, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.C, self.I, self.B = C, interleave, block_size
        I = interleave  # noqa: E741 (the design's name for it)
        self.keys = torch.randn(length, head_dim, generator=generator)
        self.values = torch.randn(length, head_dim, generator=generator)
        logical = block_size * C
        blocks = -(-length // logical)
        self.table = torch.randperm(num_blocks, generator=generator)[:blocks].to(torch.int32)
        slots = num_blocks * block_size
        # Slots no position maps to stay NaN: reading one would poison the result.
        self.key_caches = torch.full((C, 1, slots, head_dim), float("nan"))
        self.value_caches = torch.full((C, 1, slots, head_dim), float("nan"))
        for p in range(length):
            rank = (p // I) % C
            offset = p % logical
            slot = int(self.table[p // logical]) * block_size + (offset // (I * C)) * I + offset % I
            self.key_caches[rank, 0, slot] = self.keys[p]
            self.value_caches[rank, 0, slot] = self.values[p]

    def partials(self, q, positions, scale, window, isa):
        outs, lses = [], []
        for rank in range(self.C):
            out, lse = kernels.attention_shard(
                q.contiguous(), self.key_caches[rank], self.value_caches[rank], self.table[None, :].contiguous(),
                torch.zeros(q.shape[0], dtype=torch.int32), positions, self.B, scale, window, self.C, rank, self.I,
                isa,
            )  # fmt: skip
            outs.append(out)
            lses.append(lse)
        return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("isa", FAST)
@pytest.mark.parametrize(
    ("length", "C", "interleave", "window"),
    [(300, 1, 1, None), (300, 2, 1, None), (300, 2, 4, None), (257, 3, 2, None), (300, 4, 8, 50), (3, 4, 1, None)],
)
def test_sharded_attention_combines_to_dense_attention(isa, length, C, interleave, window):
    seq = ShardedSequence(length, C, interleave, seed=length + C)
    q = torch.randn(length, 4, 64, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(length)
    outs, lses = seq.partials(q, positions, 0.125, window, isa)
    out, lse = kernels.dcp_combine(outs, lses, length, 0, 4, isa)
    expected, expected_lse = dense_reference(q, seq.keys, seq.values, positions, 0.125, window)
    assert torch.allclose(out.double(), expected, atol=2e-6, rtol=1e-5)
    assert torch.allclose(lse.double(), expected_lse, atol=2e-5, rtol=1e-6)
    if length < C * interleave:  # fewer tokens than ranks: some shards hold nothing for early queries
        assert torch.isinf(lses[-1, 0]).all()


def test_empty_shards_send_no_payload_and_are_never_read():
    """Rows a rank holds no keys for carry LSE -inf; their payload (and padding rows beyond T)
    is poisoned with NaN, as a receive slot may hold anything: the combine never reads it."""
    seq = ShardedSequence(12, 4, 2, seed=3)
    q = torch.randn(12, 4, 64, generator=torch.Generator().manual_seed(4))
    outs, lses = seq.partials(q, torch.arange(12), 0.125, None, FAST[0])
    slot_outs = torch.full((4, 16, 4, 64), float("nan"))
    slot_lses = torch.full((4, 16, 4), float("nan"))
    slot_lses[:, :12] = lses
    payload = torch.isfinite(lses)[..., None].expand_as(outs)
    slot_outs[:, :12][payload] = outs[payload]  # only rows with keys were sent
    out, _ = kernels.dcp_combine(slot_outs, slot_lses, 12, 0, 4, FAST[0])
    expected, _ = dense_reference(q, seq.keys, seq.values, torch.arange(12), 0.125)
    assert torch.isfinite(out).all() and torch.allclose(out.double(), expected, atol=2e-6)


def test_all_shards_empty_gives_zeros_and_minus_infinity():
    outs = torch.full((3, 2, 2, 16), float("nan"))
    lses = torch.full((3, 2, 2), float("-inf"))
    out, lse = kernels.dcp_combine(outs, lses, 2, 0, 2, FAST[0])
    assert torch.equal(out, torch.zeros(2, 2, 16)) and torch.isinf(lse).all() and (lse < 0).all()


def test_combine_picks_the_requested_heads_and_matches_the_formula():
    generator = torch.Generator().manual_seed(5)
    outs = torch.randn(3, 5, 6, 16, generator=generator)
    lses = torch.randn(3, 5, 6, generator=generator) * 3
    lses[1, 2, 3] = float("-inf")
    out, lse = kernels.dcp_combine(outs, lses, 4, 2, 3, FAST[0])
    picked_outs, picked = outs[:, :4, 2:5].double(), lses[:, :4, 2:5].double()
    weights = torch.softmax(picked, dim=0)
    assert torch.allclose(out.double(), (weights[..., None] * picked_outs).sum(0), atol=1e-6)
    assert torch.allclose(lse.double(), torch.logsumexp(picked, dim=0), atol=1e-5)
    assert math.isclose(float(weights[1, 2, 1]), 0.0)


@pytest.mark.parametrize("isa", ISAS)
def test_every_instruction_set_gives_the_reference_bits(isa):
    seq = ShardedSequence(70, 2, 2, seed=6)
    q = torch.randn(70, 4, 64, generator=torch.Generator().manual_seed(7))
    reference = seq.partials(q, torch.arange(70), 0.125, None, "scalar")
    outs, lses = seq.partials(q, torch.arange(70), 0.125, None, isa)
    assert torch.equal(outs, reference[0]) and torch.equal(lses, reference[1])
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            kernels.dcp_combine(outs, lses, 70, 0, 4, isa), kernels.dcp_combine(*reference, 70, 0, 4, "scalar"),
            strict=True,
        )
    )
