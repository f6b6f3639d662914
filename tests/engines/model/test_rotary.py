"""Rotary tables are computed in fixed blocks as positions are first used: a position's cos and
sin are the same bits whichever step asked first, and match the closed form."""

from __future__ import annotations

import pytest
import torch

from engines.model.llama import RotaryEmbedding


def test_a_positions_tables_do_not_depend_on_which_step_needed_them_first():
    first_deep = RotaryEmbedding(64, 8192, 10000.0)
    first_deep.tables(torch.tensor([5000]), torch.float32)
    in_order = RotaryEmbedding(64, 8192, 10000.0)
    for start in range(0, 6000, 7):  # a prompt chunked at 7, then decodes
        in_order.tables(torch.arange(start, min(6000, start + 7)), torch.float32)
    positions = torch.arange(6000)
    expected = first_deep.tables(positions, torch.float32)
    for a, b in zip(expected, in_order.tables(positions, torch.float32), strict=True):
        assert torch.equal(a, b)


def test_tables_match_the_closed_form_and_refuse_positions_beyond_the_table():
    rotary = RotaryEmbedding(16, 3000, 500000.0, scaling_factor=8.0)
    positions = torch.tensor([0, 1, 1023, 1024, 2999])
    cos, sin = rotary.tables(positions, torch.float64)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, 16, 2).double() / 16)) / 8.0
    angles = positions[:, None].double() * inv_freq
    assert torch.allclose(cos, torch.cat((angles.cos(), angles.cos()), -1), atol=1e-6)
    assert torch.allclose(sin, torch.cat((angles.sin(), angles.sin()), -1), atol=1e-6)
    with pytest.raises(ValueError, match="position 3000 is beyond the rotary table"):
        rotary.tables(torch.tensor([3000]), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotation_has_the_reference_formulas_bits_for_q_and_k_together(dtype):
    """apply_rotary folds rotate-half's sign into the sin table and rotates q's and k's heads in
    one call: the bits must be the reference x * cos + rotate_half(x) * sin, head by head."""
    from engines.model.llama import apply_rotary

    rotary = RotaryEmbedding(64, 4096, 10000.0)
    positions = torch.tensor([0, 5, 17, 1023, 1024, 4000])
    x = torch.randn(len(positions), 9 + 3, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
    cos, sin = rotary.tables(positions, dtype)
    rotated_half = torch.cat((-x[..., 32:], x[..., :32]), dim=-1)
    reference = x * cos[:, None, :] + rotated_half * sin[:, None, :]
    together = apply_rotary(x, rotary.rotation(positions, dtype))
    assert torch.equal(together, reference)
    assert torch.equal(apply_rotary(x[:, :9], rotary.rotation(positions, dtype)), reference[:, :9])
