"""dpgate's mask kernel (`kernels.mask_rows`) against xgrammar's CPU kernel and a token-by-token
reference: the same bits for every kind of mask word, a partial last word, a subset of rows and
a strided logits tensor."""

from __future__ import annotations

import pytest
import torch
import xgrammar as xgr

from engines import kernels

VOCAB = 1000  # 31.25 words: the last one partial


def reference(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    out = torch.empty(len(rows), vocab)
    for j, row in enumerate(rows):
        for t in range(vocab):
            allowed = (int(bitmask[j, t // 32]) >> (t % 32)) & 1
            out[j, t] = logits[row, t] if allowed else float("-inf")
    return out


def masks(num_rows: int, vocab: int) -> torch.Tensor:
    """One row per kind of word: all allowed, none, random words, runs of each, a single token."""
    words = (vocab + 31) // 32
    generator = torch.Generator().manual_seed(5)
    kinds = [
        torch.full((words,), -1, dtype=torch.int32),
        torch.zeros(words, dtype=torch.int32),
        torch.randint(-(2**31), 2**31 - 1, (words,), dtype=torch.int32, generator=generator),
        torch.tensor([-1 if (w // 3) % 2 else 0 for w in range(words)], dtype=torch.int32),
        torch.zeros(words, dtype=torch.int32).index_fill_(0, torch.tensor([words - 1]), 1 << 7),
    ]
    return torch.stack([kinds[j % len(kinds)] for j in range(num_rows)])


@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4], [4, 1, 6], [6]])
def test_the_kernel_gives_xgrammars_bits_and_the_references(rows):
    kernels.load()
    wide = torch.randn(7, VOCAB + 24, generator=torch.Generator().manual_seed(1))
    wide[:, 3] = -0.0
    wide[2, 10] = float("inf")
    logits = wide[:, :VOCAB]  # rows VOCAB + 24 apart, as a view of a wider tensor
    bitmask = masks(len(rows), VOCAB)
    out = torch.full((len(rows) + 2, VOCAB), 7.0)[: len(rows)]  # a buffer wider than the step
    kernels.mask_rows(logits, torch.tensor(rows), bitmask, out, VOCAB)
    theirs = logits[rows].clone()
    xgr.apply_token_bitmask_inplace(theirs, bitmask, vocab_size=VOCAB)
    expected = reference(logits, rows, bitmask, VOCAB)
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))  # bits, -0.0 included
    assert torch.equal(out.view(torch.int32), theirs.view(torch.int32))


def test_bad_arguments_are_refused_naming_the_rule():
    kernels.load()
    logits, bitmask, out = torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32), torch.empty(2, 64)
    with pytest.raises(RuntimeError, match="a row index is out of range"):
        kernels.mask_rows(logits, torch.tensor([0, 2]), bitmask, out, 64)
    with pytest.raises(RuntimeError, match="bitmask must be int32"):
        kernels.mask_rows(logits, torch.tensor([0, 1]), bitmask[:, :1], out, 64)
    with pytest.raises(RuntimeError, match="vocab_size out of range"):
        kernels.mask_rows(logits, torch.tensor([0, 1]), bitmask, out, 65)
