"""Runs the model for a batch of sequence chunks over the paged KV cache.

The runner turns scheduled chunks into flat model inputs and one `AttentionMetadata`, runs one
forward for the whole batch, and returns the next-token logits of the chunks that end at their
sequence's last token. It knows token ids, positions and block tables, nothing of requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engines.kv.attention import AttentionMetadata, KVCache, PrefillSlice
from engines.kv.block_manager import blocks_needed
from engines.model.step_inputs import StepInputs
from engines.runner.loader import LoadedModel
from engines.sampling.prompt_logprobs import PromptScoring, rows_per_block, score_blocks, score_prompt_rows
from engines.sampling.tokens import SampledToken

if TYPE_CHECKING:
    from engines.parallel.rank import RankContext


@dataclass(frozen=True, slots=True)
class ChunkInput:
    """`token_ids` are fed at positions start.. of a sequence whose cache blocks are `block_table`.

    Prompt logprobs: positions score_from.. (within this chunk) are scored, position p giving the
    logprob of `score_targets[p - score_from]` (the prompt token at p + 1) and its
    `score_top_n` most likely alternatives."""

    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]
    samples: bool = True
    score_from: int = 0
    score_targets: Sequence[int] = ()
    score_top_n: int = 0


@dataclass(frozen=True, slots=True)
class StepLogits:
    """A step's result on rank 0: `logits` [num sampling chunks, vocab] float32 in chunk order, and
    `prompt_logprobs[i]` the scored prompt tokens of chunk i (empty when it scores none)."""

    logits: torch.Tensor
    prompt_logprobs: list[list[SampledToken]]


class ModelRunner:
    """Runs the model over the paged KV cache; with `parallel`, as one tensor-parallel rank.

    `block_size` is the KV slots a block has on this rank; with decode context parallelism a
    block holds that many positions on each of the C ranks, so the block manager counts
    `positions_per_block` = block_size * C. Rank 0 turns scheduled chunks into `StepInputs`,
    publishes them to its workers (engines/parallel) and runs them itself; workers run what they
    read. Every rank then builds its own AttentionMetadata: which positions it stores, where.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        max_model_len: int,
        num_blocks: int | None = None,
        block_size: int = 16,
        parallel: RankContext | None = None,
    ):
        config = loaded.config
        self.model = loaded.model
        self.kernel_isa = loaded.numerics.isa if loaded.numerics is not None else None
        self.plan = loaded.plan
        self.parallel = parallel
        self.max_model_len = max_model_len
        self.cache_block_size = block_size
        self.block_size = self.plan.tokens_per_block(block_size)  # what the block manager counts
        self.num_blocks = num_blocks or blocks_needed(max_model_len, self.block_size)
        self.cache = KVCache(
            config.num_layers, self.plan.kv_heads(config), config.head_dim, self.num_blocks, block_size, loaded.dtype
        )
        self.vocab_size = config.vocab_size  # the width of the logits
        self.score_block_rows = rows_per_block(config.vocab_size)

    def execute(self, chunks: Sequence[ChunkInput]) -> torch.Tensor:
        """One forward over all chunks: float32 logits [num sampling chunks, vocab], in chunk order."""
        return self.execute_step(chunks).logits

    def execute_step(self, chunks: Sequence[ChunkInput]) -> StepLogits:
        """One forward over all chunks: the sampling chunks' logits and the chunks' prompt logprobs."""
        inputs = self.step_inputs(chunks)
        scoring = _scoring(chunks)
        if self.parallel is None:
            return self.run(inputs, scoring)

        def publish_and_run() -> StepLogits:
            self.parallel.record.write(inputs)
            return self.run(inputs, scoring)

        return self.parallel.step(publish_and_run)

    def run(self, inputs: StepInputs, scoring: PromptScoring | None = None) -> StepLogits:
        """This rank's share of one step (workers call it with what rank 0 published, and no
        `scoring`: they run the scored rows' lm_head blocks with rank 0 and drop the result)."""
        model = self.model
        hidden = model.hidden_states(inputs.token_ids, self.cache, self.metadata(inputs))
        logits = model.compute_logits(hidden[inputs.logits_indices])
        blocks = score_blocks(inputs.score_indices, inputs.token_seq, inputs.positions, self.score_block_rows)
        prompt = score_prompt_rows(model.compute_logits, hidden, blocks, self.score_block_rows, scoring)
        return StepLogits(logits, prompt)

    def forward(self, token_ids: Sequence[int], num_cached: int) -> torch.Tensor:
        """One sequence occupying blocks 0.. of the cache (tests, warm-up): logits [vocab] of its last token."""
        table = range(blocks_needed(num_cached + len(token_ids), self.block_size))
        return self.execute([ChunkInput(token_ids, num_cached, table)])[0]

    def warm_up(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """Run the largest shapes the configuration allows before serving, so a buffer too small
        for it fails here, at start-up, in the code path that owns it, not under the first load.
        With tensor parallelism the workers run the same two steps: they follow rank 0's.

        Two steps: the widest batch (every decode slot taken, plus a prefill chunk filling the rest
        of the token budget), then one decode at the deepest position the cache holds (rotary
        tables, the longest context gather). Keeping depth out of the wide step keeps start-up
        short: 32 contexts of 8k tokens would take seconds to gather for nothing.
        """
        table = range(self.num_blocks)
        deepest = min(self.max_model_len, self.num_blocks * self.block_size)
        num_decodes = max(0, min(max_num_seqs - 1, max_num_batched_tokens - 1))
        prefill_len = min(max(2, max_num_batched_tokens - num_decodes), deepest)
        wide = [ChunkInput([0], self.block_size - 1, table) for _ in range(num_decodes)]
        wide.append(ChunkInput([0] * prefill_len, 0, table))
        for chunks in (wide, [ChunkInput([0], deepest - 1, table)]):
            logits = self.execute(chunks)
            if logits.shape[0] != len(chunks) or not torch.isfinite(logits).all():
                raise RuntimeError(f"warm-up produced logits of shape {tuple(logits.shape)} with non-finite values")

    def step_inputs(self, chunks: Sequence[ChunkInput]) -> StepInputs:
        size = self.block_size
        token_ids, positions, token_seq, logits_indices, tables, score_indices = [], [], [], [], [], []
        row = 0
        for index, chunk in enumerate(chunks):
            end = chunk.start + len(chunk.token_ids)
            if end > self.max_model_len:
                raise ValueError(f"a sequence of {end} tokens exceeds max_model_len {self.max_model_len}")
            table = list(chunk.block_table[: blocks_needed(end, size)])
            if len(table) < blocks_needed(end, size):
                raise ValueError(f"block table has {len(table)} blocks; {end} tokens need {blocks_needed(end, size)}")
            if chunk.score_targets:
                assert chunk.start <= chunk.score_from and chunk.score_from + len(chunk.score_targets) <= end
                first = row + chunk.score_from - chunk.start
                score_indices.extend(range(first, first + len(chunk.score_targets)))
            token_ids.extend(chunk.token_ids)
            positions.extend(range(chunk.start, end))
            token_seq.extend([index] * len(chunk.token_ids))
            tables.append(table)
            row += len(chunk.token_ids)
            if chunk.samples:
                logits_indices.append(row - 1)
        width = max(len(t) for t in tables)
        return StepInputs(
            token_ids=torch.tensor(token_ids, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            token_seq=torch.tensor(token_seq, dtype=torch.int32),
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
            logits_indices=torch.tensor(logits_indices, dtype=torch.long),
            score_indices=torch.tensor(score_indices, dtype=torch.long),
            chunk_starts=tuple(chunk.start for chunk in chunks),
            chunk_lengths=tuple(len(chunk.token_ids) for chunk in chunks),
        )

    def metadata(self, inputs: StepInputs) -> AttentionMetadata:
        """Where this rank stores the step's keys and values, and what attention reads."""
        plan, cache_block = self.plan, self.cache_block_size
        positions, seq = inputs.positions, inputs.token_seq.long()
        blocks = inputs.block_tables.long()[seq, positions // self.block_size]
        kv_rows = None
        if plan.dcp_size == 1:
            slots = blocks * cache_block + positions % cache_block
        else:  # position p lives on DCP rank (p // I) % C, at its local offset within the block
            interleave, dcp_size = plan.interleave, plan.dcp_size
            mine = (positions // interleave) % dcp_size == self.parallel.dcp_rank
            offsets = positions % self.block_size
            slots = blocks * cache_block + (offsets // (interleave * dcp_size)) * interleave + offsets % interleave
            kv_rows = mine.nonzero().squeeze(1)
            slots = slots[kv_rows]
        meta = AttentionMetadata(
            positions=positions,
            slot_mapping=slots,
            logits_indices=inputs.logits_indices,
            kernel_isa=self.kernel_isa,
            kv_rows=kv_rows,
            dcp=self.parallel.dcp_step() if self.parallel is not None and plan.dcp_size > 1 else None,
        )
        if self.kernel_isa is not None:
            meta.block_tables, meta.token_seq = inputs.block_tables, inputs.token_seq
            return meta
        return _with_torch_attention_inputs(meta, inputs, cache_block)


def _scoring(chunks: Sequence[ChunkInput]) -> PromptScoring | None:
    """Rank 0's targets for the step's scored rows, in row order; None when no chunk scores."""
    if not any(chunk.score_targets for chunk in chunks):
        return None
    targets, top_n, chunk_of_row = [], [], []
    for index, chunk in enumerate(chunks):
        targets.extend(chunk.score_targets)
        top_n.extend([chunk.score_top_n] * len(chunk.score_targets))
        chunk_of_row.extend([index] * len(chunk.score_targets))
    return PromptScoring(targets, top_n, chunk_of_row, len(chunks))


def _with_torch_attention_inputs(meta: AttentionMetadata, inputs: StepInputs, block_size: int) -> AttentionMetadata:
    """The padded decode batch and the per-sequence prefill slices torch's attention path reads."""
    decode_rows, decode_tables, decode_positions = [], [], []
    row = 0
    for index, (start, length) in enumerate(zip(inputs.chunk_starts, inputs.chunk_lengths, strict=True)):
        table = inputs.block_tables[index, : blocks_needed(start + length, block_size)].long()
        if length == 1:
            decode_rows.append(row)
            decode_tables.append(table)
            decode_positions.append(start)
        else:
            positions = torch.arange(start, start + length)
            meta.prefills.append(PrefillSlice(row, length, start + length, table, positions))
        row += length
    width = max((len(t) for t in decode_tables), default=0)
    decode_blocks = torch.zeros(len(decode_tables), width, dtype=torch.long)
    for i, table in enumerate(decode_tables):
        decode_blocks[i, : len(table)] = table
    meta.decode_rows = torch.tensor(decode_rows, dtype=torch.long)
    meta.decode_blocks = decode_blocks
    meta.decode_positions = torch.tensor(decode_positions, dtype=torch.long)
    return meta
