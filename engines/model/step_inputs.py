"""What one step of the model runner consumes: the tokens, their positions and chunks, block tables
and the rows to sample or score. Built by the runner on rank 0 and, under tensor parallelism,
copied to every rank through the step record (engines/parallel/step_record.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class StepInputs:
    """One step: `token_ids`/`positions`/`token_seq` [tokens] (token_seq: the chunk of each
    token), `block_tables` [chunks, width] int32 (padded with 0), `logits_indices` [sampled],
    `score_indices` [scored] the rows whose prompt logprobs are wanted (ascending).
    `chunk_starts`/`chunk_lengths`: each chunk's first position and token count, as the plain
    integers the runner planned them with (attention's torch path slices by them)."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    token_seq: torch.Tensor
    block_tables: torch.Tensor
    logits_indices: torch.Tensor
    score_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    chunk_starts: tuple[int, ...] = ()
    chunk_lengths: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]
