"""The synchronous engine core: `step()` schedules, runs one batched forward, samples.

A handful of lines on purpose: the scheduler decides, the runner computes, the sampler picks,
and each sequence applies its own stop rules.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engines.grammar.bitmask import FilledMasks, MaskBuffers, MaskedRows, apply_masks, fill_masks
from engines.kv.block_manager import BlockManager
from engines.kv.prefix_hash import root_hash
from engines.runner.model_runner import ChunkInput, ModelRunner
from engines.sampling.params import UnsampleableRowError
from engines.sampling.sampler import greedy_tokens, is_plain_greedy, request_generator, sample
from engines.sampling.tokens import SampledToken
from engines.scheduling.scheduler import Scheduler, SchedulerConfig
from engines.scheduling.sequence import Sequence, StepOutput


@dataclass(slots=True)
class StepStats:
    """What the last step did, for metrics."""

    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_preempted: int = 0
    seconds: float = 0.0


class LLMEngine:
    def __init__(
        self,
        runner: ModelRunner,
        config: SchedulerConfig | None = None,
        prefix_caching: bool = True,
        fingerprint: bytes = b"",
    ):
        """`fingerprint`: what makes this engine's keys and values what they are (the model's
        weights, tokenizer and numerics: engines/model/fingerprint.py); the root of its block hashes."""
        self.runner = runner
        self.block_manager = BlockManager(runner.num_blocks, runner.block_size, prefix_caching, root_hash(fingerprint))
        self.scheduler = Scheduler(config or SchedulerConfig(), self.block_manager)
        self.last_step = StepStats()
        self.mask_buffers = MaskBuffers()
        self.mask_seconds = 0.0  # time spent filling and applying grammar masks, for benchmarks

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def kv_usage(self) -> float:
        return self.block_manager.usage

    def reset_prefix_cache(self) -> None:
        """Forget every cached block; sequences keep the blocks they hold."""
        self.block_manager.reset()

    def add(self, seq: Sequence) -> None:
        """Queue a sequence; raises QueueFullError or RequestTooLargeError (both RESOURCE_EXHAUSTED)."""
        self.scheduler.add(seq)

    def abort(self, handle: int) -> StepOutput | None:
        """End a waiting or running request (by Sequence.handle) and free its blocks; None when it
        is not here."""
        seq = self.scheduler.abort(handle)
        return seq.abort() if seq is not None else None

    def step(self) -> list[StepOutput]:
        started = time.perf_counter()
        scheduled = self.scheduler.schedule()
        if not scheduled.chunks:
            return []
        sampling = [chunk.seq for chunk in scheduled.chunks if chunk.samples]
        masks = self._fill_grammar_masks(sampling)  # before the forward, while the matchers are in cache
        inputs = [self._chunk_input(c.seq, c.start, c.num_tokens, c.samples) for c in scheduled.chunks]
        step = self.runner.execute_step(inputs)
        logits = step.logits
        stats = StepStats(num_preempted=scheduled.num_preempted)
        for chunk, scored in zip(scheduled.chunks, step.prompt_logprobs or [[]] * len(inputs), strict=True):
            seq = chunk.seq
            seq.prompt_logprobs.extend(scored)
            seq.num_computed_tokens = chunk.start + chunk.num_tokens
            self.scheduler.cache_computed(seq)
            stats.num_prompt_tokens += max(0, min(seq.num_computed_tokens, len(seq.prompt_ids)) - chunk.start)
        outputs = self._sample(sampling, logits, masks, stats)
        stats.seconds = time.perf_counter() - started
        self.last_step = stats
        return outputs

    @staticmethod
    def _chunk_input(seq: Sequence, start: int, num_tokens: int, samples: bool) -> ChunkInput:
        score_from, targets = seq.prompt_scoring(start, num_tokens)
        assert not targets or score_from == len(seq.prompt_logprobs)  # scored in order, each position once
        return ChunkInput(
            _chunk_token_ids(seq, start, num_tokens),
            start,
            seq.block_table,
            samples,
            score_from,
            targets,
            seq.sampling.prompt_logprobs or 0,
        )

    def _sample(
        self, seqs: list[Sequence], logits: torch.Tensor, masks: FilledMasks | None, stats: StepStats
    ) -> list[StepOutput]:
        """Row i of `logits` is seqs[i]'s next token. Constrained rows are masked first, all at once;
        a row its grammar leaves empty, or whose parameters leave no distribution, ends that request
        with an error (the client's) and the rest of the batch goes on. Plain
        greedy rows take their argmax together (one op, one host copy), masked or not; the others
        `sample`."""
        masked = self._apply_grammar_masks(logits, masks)
        greedy = greedy_tokens(logits, _plain_greedy_rows(seqs, masked))
        greedy |= _greedy_masked_tokens(seqs, masked)
        outputs = []
        for row, seq in enumerate(seqs):
            if row in masked.conflicts:
                outputs.append(seq.fail(masked.conflicts[row]))
            elif row in greedy:
                outputs.append(seq.append(greedy[row]))
                stats.num_generated_tokens += 1
            else:
                if row in masked.index:  # a scratch copy, masked; the raw row stays for logprobs
                    row_logits, raw = masked.logits[masked.index[row]], logits[row]
                else:
                    row_logits, raw = logits[row], None
                if seq.generator is None:
                    seq.generator = request_generator(seq.sampling)
                try:
                    sampled = sample(
                        row_logits,
                        seq.sampling,
                        seq.generator,
                        seq.prompt_ids,
                        seq.output_ids,
                        seq.blocked_token_ids,
                        raw_logits=raw,
                    )
                except UnsampleableRowError as error:  # this row's own parameters: only it ends
                    outputs.append(seq.fail(error))
                else:
                    outputs.append(seq.append(sampled))
                    stats.num_generated_tokens += 1
            if seq.is_finished:
                self.scheduler.finish(seq)
        return outputs

    def _fill_grammar_masks(self, seqs: list[Sequence]) -> FilledMasks | None:
        """One bitmask for the step's constrained rows; None when there are none."""
        if not any(seq.grammar is not None for seq in seqs):
            return None
        started = time.perf_counter()
        masks = fill_masks(seqs, self.runner.vocab_size, self.mask_buffers)
        self.mask_seconds += time.perf_counter() - started
        return masks

    def _apply_grammar_masks(self, logits: torch.Tensor, masks: FilledMasks | None) -> MaskedRows:
        """The constrained rows masked in one pass (copies; the raw rows stay for logprobs)."""
        started = time.perf_counter()
        masked = apply_masks(logits, masks, with_kernel=self.runner.kernel_isa is not None)
        if masks is not None:
            self.mask_seconds += time.perf_counter() - started
        return masked


def _plain_greedy_rows(seqs: list[Sequence], masked: MaskedRows) -> list[int]:
    """Rows whose token is simply their argmax: greedy, unconstrained, nothing else asked."""
    special = masked.index.keys() | masked.conflicts.keys()
    return [
        row
        for row, seq in enumerate(seqs)
        if row not in special and is_plain_greedy(seq.sampling, seq.blocked_token_ids)
    ]


def _greedy_masked_tokens(seqs: list[Sequence], masked: MaskedRows) -> dict[int, SampledToken]:
    """The argmax of each masked row whose request is greedy with nothing else asked, by batch
    row: what `sample` would pick (its stop tokens blocked before min_tokens are already cleared
    from the mask), in one op for all of them."""
    rows = [row for row in masked.index if row not in masked.conflicts and is_plain_greedy(seqs[row].sampling)]
    picked = greedy_tokens(masked.logits, [masked.index[row] for row in rows])
    return {row: picked[masked.index[row]] for row in rows}


def _chunk_token_ids(seq: Sequence, start: int, num_tokens: int) -> list[int]:
    """seq.token_ids[start : start + num_tokens] without building prompt + output first (a decode
    needs one output token, not a copy of the whole sequence per step)."""
    num_prompt = len(seq.prompt_ids)
    if start >= num_prompt:
        return seq.output_ids[start - num_prompt : start - num_prompt + num_tokens]
    if start + num_tokens <= num_prompt:
        return seq.prompt_ids[start : start + num_tokens]
    return seq.token_ids[start : start + num_tokens]
