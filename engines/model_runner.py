"""Runs the model for a batch of sequence chunks over the paged KV cache.

The runner turns scheduled chunks into flat model inputs and one `AttentionMetadata`, runs one
forward for the whole batch, and returns the next-token logits of the chunks that end at their
sequence's last token. It knows token ids, positions and block tables, nothing of requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engines.attention import AttentionMetadata, KVCache, PrefillSlice
from engines.block_manager import blocks_needed
from engines.loader import LoadedModel


@dataclass(frozen=True, slots=True)
class ChunkInput:
    """`token_ids` are fed at positions start.. of a sequence whose cache blocks are `block_table`."""

    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]
    samples: bool = True


class ModelRunner:
    def __init__(self, loaded: LoadedModel, max_model_len: int, num_blocks: int | None = None, block_size: int = 16):
        config = loaded.config
        self.model = loaded.model
        self.kernel_isa = loaded.numerics.isa if loaded.numerics is not None else None
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.num_blocks = num_blocks or blocks_needed(max_model_len, block_size)
        self.cache = KVCache(
            config.num_layers, config.num_kv_heads, config.head_dim, self.num_blocks, block_size, loaded.dtype
        )

    def execute(self, chunks: Sequence[ChunkInput]) -> torch.Tensor:
        """One forward over all chunks: float32 logits [num sampling chunks, vocab], in chunk order."""
        input_ids = torch.tensor([t for chunk in chunks for t in chunk.token_ids], dtype=torch.long)
        return self.model(input_ids, self.cache, self.prepare(chunks))

    def forward(self, token_ids: Sequence[int], num_cached: int) -> torch.Tensor:
        """One sequence occupying blocks 0.. of the cache (tests, warm-up): logits [vocab] of its last token."""
        table = range(blocks_needed(num_cached + len(token_ids), self.block_size))
        return self.execute([ChunkInput(token_ids, num_cached, table)])[0]

    def warm_up(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """Run the largest shapes the configuration allows before serving, so a buffer too small
        for it fails here, at start-up, in the code path that owns it, not under the first load.

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

    def prepare(self, chunks: Sequence[ChunkInput]) -> AttentionMetadata:
        size = self.block_size
        positions, slots, logits_indices, tables = [], [], [], []
        row = 0
        for chunk in chunks:
            end = chunk.start + len(chunk.token_ids)
            if end > self.max_model_len:
                raise ValueError(f"a sequence of {end} tokens exceeds max_model_len {self.max_model_len}")
            table = list(chunk.block_table[: blocks_needed(end, size)])
            if len(table) < blocks_needed(end, size):
                raise ValueError(f"block table has {len(table)} blocks; {end} tokens need {blocks_needed(end, size)}")
            positions.extend(range(chunk.start, end))
            slots.extend(table[p // size] * size + p % size for p in range(chunk.start, end))
            tables.append(table)
            row += len(chunk.token_ids)
            if chunk.samples:
                logits_indices.append(row - 1)
        meta = AttentionMetadata(
            positions=torch.tensor(positions, dtype=torch.long),
            slot_mapping=torch.tensor(slots, dtype=torch.long),
            logits_indices=torch.tensor(logits_indices, dtype=torch.long),
            kernel_isa=self.kernel_isa,
        )
        if self.kernel_isa is not None:
            width = max(len(t) for t in tables)
            meta.block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
            meta.token_seq = torch.tensor(
                [i for i, chunk in enumerate(chunks) for _ in chunk.token_ids], dtype=torch.int32
            )
            return meta
        return _with_torch_attention_inputs(meta, chunks, tables)


def _with_torch_attention_inputs(
    meta: AttentionMetadata, chunks: Sequence[ChunkInput], tables: list[list[int]]
) -> AttentionMetadata:
    """The padded decode batch and the per-sequence prefill slices torch's attention path reads."""
    decode_rows, decode_tables, decode_positions = [], [], []
    row = 0
    for chunk, table in zip(chunks, tables, strict=True):
        end = chunk.start + len(chunk.token_ids)
        if len(chunk.token_ids) == 1:
            decode_rows.append(row)
            decode_tables.append(table)
            decode_positions.append(chunk.start)
        else:
            blocks = torch.tensor(table, dtype=torch.long)
            meta.prefills.append(PrefillSlice(row, len(chunk.token_ids), end, blocks, torch.arange(chunk.start, end)))
        row += len(chunk.token_ids)
    width = max((len(t) for t in decode_tables), default=0)
    decode_blocks = torch.tensor([t + [0] * (width - len(t)) for t in decode_tables], dtype=torch.long)
    meta.decode_rows = torch.tensor(decode_rows, dtype=torch.long)
    meta.decode_blocks = decode_blocks.reshape(len(decode_tables), width)
    meta.decode_positions = torch.tensor(decode_positions, dtype=torch.long)
    return meta
