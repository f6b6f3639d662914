"""Continuous batching: decides, each step, which sequences run and how many tokens each feeds.

Order of a step, within a token budget: decodes of running sequences first (one token each),
then the next chunk of running prefills, then new sequences from the waiting queue (their prompt
possibly cut into chunks). When a running sequence needs a block and none is free, the newest
running sequence is preempted by recompute: its blocks are freed and it waits at the front of
the queue to prefill its prompt and output again. Pure bookkeeping: no torch.

Prefix caching: a sequence taken from the queue first looks its leading full blocks up in the
block manager's cache; the blocks found are shared into its table and its computed tokens start
after them, so only the rest is prefilled (in chunks, within the budget, as any prompt). A
sequence whose first missing block a running prompt is still computing stays in the queue (those
behind it may go first) until that block is cached, instead of computing it a second time. A
request asking for prompt logprobs does not look up: every position it scores must be computed
(its blocks are still registered for others). The token count taken from the cache at a
request's first admission is what its usage reports.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engines.kv.block_manager import BlockManager, PrefixHit, blocks_needed

if TYPE_CHECKING:
    from engines.scheduling.sequence import Sequence


class QueueFullError(RuntimeError):
    """The waiting queue is at its limit (RESOURCE_EXHAUSTED)."""


class RequestTooLargeError(RuntimeError):
    """The request could not fit the KV cache even alone (RESOURCE_EXHAUSTED)."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_waiting: int = 256
    # A step that has finished a prompt takes no more prompt tokens once it holds this many.
    step_tokens_after_a_finished_prompt: int = 128


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """`num_tokens` of `seq`'s tokens, starting at `start`, are fed this step. `samples`: the chunk
    reaches the sequence's last token, so the step yields its next token (decided when scheduled,
    before the sequence grows)."""

    seq: Sequence
    start: int
    num_tokens: int
    samples: bool

    @classmethod
    def of(cls, seq: Sequence, num_tokens: int) -> ScheduledChunk:
        start = seq.num_computed_tokens
        return cls(seq, start, num_tokens, start + num_tokens == seq.num_tokens)


@dataclass(slots=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    num_preempted: int = 0
    num_prompts_finished: int = 0  # prompt chunks that reach their sequence's end (not decodes)

    def add(self, seq: Sequence, num_tokens: int, prompt: bool) -> None:
        chunk = ScheduledChunk.of(seq, num_tokens)
        self.chunks.append(chunk)
        self.num_prompts_finished += prompt and chunk.samples


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._announced: set[int] = set()  # handles whose prompt the block manager announced

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        worst_case = blocks_needed(len(seq.prompt_ids) + seq.stopping.max_tokens, self.block_manager.block_size)
        if worst_case > self.block_manager.num_blocks:
            raise RequestTooLargeError(
                f"the request needs up to {worst_case} KV-cache blocks (prompt plus max_tokens) but the cache "
                f"has {self.block_manager.num_blocks}"
            )
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFullError(f"the engine's waiting queue is full ({self.config.max_waiting} requests)")
        self.waiting.append(seq)
        if seq.sampling.prompt_logprobs is None and self.block_manager.announce(seq.handle, seq.prefix, seq.prompt_ids):
            self._announced.add(seq.handle)

    def abort(self, handle: int) -> Sequence | None:
        """Remove the sequence with this handle (Sequence.handle) and free its blocks."""
        for queue in (self.running, self.waiting):
            for seq in queue:
                if seq.handle == handle:
                    queue.remove(seq)
                    self.block_manager.free(seq.block_table)
                    self._settle(seq)
                    return seq
        return None

    def finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq.block_table)
        self._settle(seq)

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        decodes = [s for s in self.running if s.num_tokens - s.num_computed_tokens == 1]
        prefills = [s for s in self.running if s.num_tokens - s.num_computed_tokens > 1]
        for seq in decodes + prefills:
            if budget == 0 or self._full_after_a_finished_prompt(output, budget):
                break
            if seq not in self.running:  # preempted earlier in this step
                continue
            remaining = seq.num_tokens - seq.num_computed_tokens
            num_tokens = min(remaining, budget)
            if not self._make_room(seq, num_tokens, output):
                continue
            output.add(seq, num_tokens, prompt=remaining > 1)
            budget -= num_tokens
        index = 0  # waiting sequences before it wait for a running prefill of their prefix
        while index < len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            if output.num_preempted:
                break  # blocks are short: let the running sequences drain first
            if self._full_after_a_finished_prompt(output, budget):
                break
            seq = self.waiting[index]
            hit = self._lookup(seq)
            if self._awaits_running_prefill(seq, len(hit.blocks)):
                index += 1
                continue
            num_cached = len(hit.blocks) * self.block_manager.block_size
            num_tokens = min(seq.num_tokens - num_cached, budget)
            if not self.block_manager.can_take(hit, seq.block_table, num_cached + num_tokens):
                break
            del self.waiting[index]
            self.running.append(seq)
            self._admit(seq, hit)
            self.block_manager.grow(seq.block_table, seq.num_computed_tokens + num_tokens)
            output.add(seq, num_tokens, prompt=True)
            budget -= num_tokens
        return output

    def _full_after_a_finished_prompt(self, output: SchedulerOutput, budget: int) -> bool:
        """Whether the step should end here: it finishes a prompt and already holds enough tokens.

        A prompt's first token waits for its whole step, so prompt tokens that can as well run next
        step would only hold it back. On a CPU a step's cost is flat per token from about 128 tokens
        up (docs/engine.md, "Steps end after a finished prompt"), so ending steps there
        costs next to no throughput, while a burst of short prompts (a cached prefix, short
        questions) gets its first tokens in turn instead of all at the end of a long step. It
        changes only which chunks share a step, which the batch-invariant kernels make bit-identical.
        """
        used = self.config.max_num_batched_tokens - budget
        return output.num_prompts_finished > 0 and used >= self.config.step_tokens_after_a_finished_prompt

    def cache_computed(self, seq: Sequence) -> None:
        """After a step: register the sequence's blocks its keys and values now fill; a prompt
        now computed is no longer announced as on its way in (after its blocks' stored events)."""
        self.block_manager.cache_blocks(seq.prefix, seq.block_table, seq.num_computed_tokens, lambda: seq.token_ids)
        if seq.num_computed_tokens >= len(seq.prompt_ids) - 1:
            self._settle(seq)

    def _settle(self, seq: Sequence) -> None:
        if seq.handle in self._announced:
            self._announced.discard(seq.handle)
            self.block_manager.settle(seq.handle)

    def _lookup(self, seq: Sequence) -> PrefixHit:
        """The cached blocks a sequence leaving the queue can start from (none for prompt logprobs)."""
        if seq.sampling.prompt_logprobs is not None or not self.block_manager.enable_caching:
            return PrefixHit()
        return self.block_manager.match_prefix(seq.prefix, seq.token_ids)

    def _awaits_running_prefill(self, seq: Sequence, num_hit_blocks: int) -> bool:
        """Whether a running prompt is still to compute the first block `seq` would miss.

        A block is cached only once computed, so two prompts with one prefix admitted in the same
        step or two (a group's calls routed together, a conversation's retry) would both compute
        it. The later one waits in the queue, letting those behind it go first, until the earlier
        has computed the block (a few steps at most: running prefills go before admissions), and
        then takes it from the cache. A sequence preempted or finished stops holding anyone back.
        """
        hashes = seq.prefix.hashes
        if num_hit_blocks >= len(hashes) or not self.block_manager.enable_caching:
            return False
        wanted = hashes[num_hit_blocks]
        computed_before = (num_hit_blocks + 1) * self.block_manager.block_size
        for other in self.running:
            others = other.prefix.hashes
            if (
                num_hit_blocks < len(others)
                and others[num_hit_blocks] == wanted
                and other.num_computed_tokens < computed_before
            ):
                return True
        return False

    def _admit(self, seq: Sequence, hit: PrefixHit) -> None:
        """Share the hit's blocks into the sequence's empty table; its computation starts after them."""
        seq.prefix.serials = []
        if self.block_manager.enable_caching and seq.sampling.prompt_logprobs is None:
            seq.num_computed_tokens = self.block_manager.take(hit, seq.prefix, seq.block_table, seq.num_tokens)
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = seq.num_computed_tokens

    def _make_room(self, seq: Sequence, num_tokens: int, output: SchedulerOutput) -> bool:
        """Grow `seq`'s blocks for this chunk, preempting the newest running sequences as needed.
        False when `seq` itself had to be preempted."""
        needed = seq.num_computed_tokens + num_tokens
        while not self.block_manager.can_grow(seq.block_table, needed):
            victim = self.running[-1]
            self._preempt(victim, output)
            if victim is seq:
                return False
        self.block_manager.grow(seq.block_table, needed)
        return True

    def _preempt(self, seq: Sequence, output: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq.block_table)
        seq.num_computed_tokens = 0
        self.waiting.appendleft(seq)
        output.num_preempted += 1
        self.num_preemptions += 1
