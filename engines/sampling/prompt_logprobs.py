"""Prompt logprobs: the log-probability of each prompt token given the tokens before it.

A step's scored rows are the prompt positions whose next token is a prompt token. Their logits
are computed in blocks of a fixed `rows_per_block` rows, each block within one chunk and one
aligned run of positions [k * R, (k + 1) * R), padded with zero rows to exactly R rows: memory
stays bounded (never [prompt_len, vocab] at once), and the lm_head always multiplies the same
shape, so a position's logprob is the same bits whatever else the step holds and however the
prompt was cut into chunks. Every tensor-parallel rank runs the same blocks in the same order
(the vocabulary-parallel head gathers per block); only rank 0, which knows the targets, reduces
them: float64 log_softmax reported as float32, as the sampled tokens' logprobs are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engines.sampling.tokens import SampledToken

# Logit elements per block: 4M float32 (16 MB) plus their float64 log_softmax (32 MB).
SCORE_BLOCK_ELEMENTS = 1 << 22


def rows_per_block(vocab_size: int) -> int:
    """R for a vocabulary: fixed per model, so every block of every step has the same shape."""
    return max(1, SCORE_BLOCK_ELEMENTS // vocab_size)


@dataclass(frozen=True, slots=True)
class PromptScoring:
    """Rank 0's half of a step's scoring, row for row with the step's `score_indices`: the prompt
    token each row predicts, how many alternatives it wants, and which chunk it belongs to."""

    targets: list[int]
    top_n: list[int]
    chunk_of_row: list[int]
    num_chunks: int


def score_blocks(
    score_indices: torch.Tensor, token_seq: torch.Tensor, positions: torch.Tensor, block_rows: int
) -> list[torch.Tensor]:
    """Split the scored rows (ascending) into blocks of at most `block_rows` rows that share a chunk
    and an aligned position block; each block a tensor of row indices."""
    if score_indices.numel() == 0:
        return []
    keys = token_seq[score_indices].long() * (1 << 40) + positions[score_indices] // block_rows
    _, counts = torch.unique_consecutive(keys, return_counts=True)
    return list(torch.split(score_indices, counts.tolist()))


def score_prompt_rows(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    blocks: list[torch.Tensor],
    block_rows: int,
    scoring: PromptScoring | None,
) -> list[list[SampledToken]]:
    """Run the lm_head over each block of `hidden` [tokens, hidden_size] rows and, on rank 0
    (`scoring` given), return each chunk's scored tokens in order; workers (None) only take part."""
    per_chunk: list[list[SampledToken]] = [[] for _ in range(scoring.num_chunks if scoring else 0)]
    row = 0
    for block in blocks:
        n = block.shape[0]
        padded = hidden.new_zeros(block_rows, hidden.shape[1])
        padded[:n] = hidden[block]
        logits = compute_logits(padded)
        if scoring is None:
            continue
        logprobs = logits[:n].double().log_softmax(-1).float()
        targets = torch.tensor(scoring.targets[row : row + n], dtype=torch.long)
        chosen = logprobs.gather(1, targets[:, None]).squeeze(1).tolist()
        for i in range(n):
            top = ()
            if k := scoring.top_n[row + i]:
                values, ids = torch.topk(logprobs[i], k)
                top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
            per_chunk[scoring.chunk_of_row[row + i]].append(SampledToken(int(targets[i]), chosen[i], top))
        row += n
    return per_chunk
