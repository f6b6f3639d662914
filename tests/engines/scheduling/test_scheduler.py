"""The scheduler's decisions on plain data: budgets, chunking, admission, preemption."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from engines.kv.block_manager import BlockManager, BlockStored, PrefixAnnounced, PrefixSettled, PrefixState
from engines.sampling.params import SamplingParams, StoppingParams
from engines.scheduling.scheduler import QueueFullError, RequestTooLargeError, Scheduler, SchedulerConfig


@dataclass(eq=False)
class FakeSequence:
    """The fields the scheduler reads, nothing else (no torch, no tokenizer)."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int = 8
    handle: int = field(default_factory=itertools.count(1).__next__)
    output_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prefix: PrefixState = field(default_factory=PrefixState)
    num_cached_tokens: int | None = None

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def stopping(self) -> StoppingParams:
        return StoppingParams(max_tokens=self.max_tokens)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


def make(num_blocks=16, block_size=4, caching=False, **config) -> Scheduler:
    return Scheduler(SchedulerConfig(**config), BlockManager(num_blocks, block_size, enable_caching=caching))


def run_step(scheduler: Scheduler):
    """Apply a step as the engine would: advance computed tokens, add one output per sampling chunk."""
    output = scheduler.schedule()
    for chunk in output.chunks:
        chunk.seq.num_computed_tokens = chunk.start + chunk.num_tokens
        scheduler.cache_computed(chunk.seq)
        if chunk.samples:
            chunk.seq.output_ids.append(7)
    scheduler.block_manager.check_invariants(s.block_table for s in scheduler.running)
    return output


def test_a_long_prompt_is_prefilled_in_chunks_within_the_token_budget():
    scheduler = make(max_num_batched_tokens=8)
    seq = FakeSequence("a", list(range(20)))
    scheduler.add(seq)
    sizes = []
    while not seq.output_ids:
        sizes.append([(c.start, c.num_tokens, c.samples) for c in run_step(scheduler).chunks])
    assert sizes == [[(0, 8, False)], [(8, 8, False)], [(16, 4, True)]]


def test_decodes_come_first_and_prefill_chunks_fill_the_rest_of_the_budget():
    scheduler = make(max_num_batched_tokens=6)
    first = FakeSequence("first", [1, 2])
    scheduler.add(first)
    run_step(scheduler)  # first prefilled, one token out
    second = FakeSequence("second", list(range(10)))
    scheduler.add(second)
    chunks = run_step(scheduler).chunks
    assert [(c.seq.request_id, c.num_tokens) for c in chunks] == [("first", 1), ("second", 5)]


def test_admission_stops_at_max_num_seqs():
    scheduler = make(max_num_seqs=2)
    for name in "abc":
        scheduler.add(FakeSequence(name, [1, 2, 3]))
    run_step(scheduler)
    assert [s.request_id for s in scheduler.running] == ["a", "b"]
    assert [s.request_id for s in scheduler.waiting] == ["c"]


def test_when_blocks_run_out_the_newest_running_sequence_is_preempted_and_recomputed():
    scheduler = make(num_blocks=4, block_size=2, max_num_batched_tokens=64)
    old, new = FakeSequence("old", [1, 2, 3], max_tokens=5), FakeSequence("new", [4, 5, 6], max_tokens=5)
    scheduler.add(old)
    scheduler.add(new)
    run_step(scheduler)  # both prefilled (3 tokens in 2 blocks each): the cache is full
    run_step(scheduler)  # both decode their 4th token, still within 2 blocks
    output = run_step(scheduler)  # both need a third block for the 5th: "new" is preempted
    assert output.num_preempted == 1 and scheduler.num_preemptions == 1
    assert [c.seq.request_id for c in output.chunks] == ["old"]
    assert list(scheduler.waiting) == [new] and new.block_table == [] and new.num_computed_tokens == 0
    while scheduler.running:
        run_step(scheduler)
        for seq in list(scheduler.running):
            if len(seq.output_ids) >= seq.max_tokens:
                scheduler.finish(seq)
    chunk = scheduler.schedule().chunks[0]
    assert (chunk.seq, chunk.start, chunk.num_tokens) == (new, 0, 5)  # its prompt and 2 outputs again
    assert chunk.samples


def test_abort_frees_blocks_of_running_and_waiting_sequences():
    scheduler = make(num_blocks=4, block_size=4, max_num_seqs=1)
    running, waiting = FakeSequence("r", [1] * 6), FakeSequence("w", [2] * 3)
    scheduler.add(running)
    scheduler.add(waiting)
    run_step(scheduler)
    assert scheduler.abort(running.handle) is running and scheduler.block_manager.num_free_blocks == 4
    assert scheduler.abort(waiting.handle) is waiting and not scheduler.has_work
    assert scheduler.abort(running.handle) is None


def test_a_request_that_cannot_fit_even_alone_is_refused():
    scheduler = make(num_blocks=2, block_size=4)
    with pytest.raises(RequestTooLargeError, match=r"needs up to 3 KV-cache blocks .* the cache has 2"):
        scheduler.add(FakeSequence("big", [1] * 5, max_tokens=5))


def test_a_full_waiting_queue_refuses_new_requests():
    scheduler = make(max_waiting=1)
    scheduler.add(FakeSequence("a", [1]))
    with pytest.raises(QueueFullError, match="waiting queue is full"):
        scheduler.add(FakeSequence("b", [1]))


def test_a_cached_prefix_starts_the_sequence_after_it_and_the_rest_is_chunked():
    scheduler = make(num_blocks=16, block_size=4, caching=True, max_num_batched_tokens=4)
    first = FakeSequence("a", list(range(14)), max_tokens=1)
    scheduler.add(first)
    while first.output_ids == []:
        run_step(scheduler)
    scheduler.finish(first)  # its blocks stay cached, unreferenced
    second = FakeSequence("b", [*list(range(12)), 90, 91, 92, 93, 94], max_tokens=1)
    scheduler.add(second)
    output = run_step(scheduler)
    assert second.num_cached_tokens == 12
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in output.chunks][-1] == ("b", 12, 4)
    assert scheduler.block_manager.ref_counts[second.block_table[0]] == 1  # revived from the LRU


def test_preempting_a_sequence_that_shares_blocks_keeps_the_other_ones():
    scheduler = make(num_blocks=6, block_size=4, caching=True, max_num_batched_tokens=64)
    a = FakeSequence("a", list(range(9)), max_tokens=12)
    scheduler.add(a)
    run_step(scheduler)
    b = FakeSequence("b", [*list(range(8)), 50], max_tokens=12)
    scheduler.add(b)
    run_step(scheduler)
    assert b.num_cached_tokens == 8 and b.block_table[:2] == a.block_table[:2]
    preempted = 0
    for _ in range(30):
        preempted += run_step(scheduler).num_preempted
        if not scheduler.running and not scheduler.waiting:
            break
        for seq in list(scheduler.running):
            if len(seq.output_ids) >= seq.max_tokens:
                scheduler.finish(seq)
    assert preempted > 0
    assert len(a.output_ids) >= 12 and len(b.output_ids) >= 12


def step_plan(output) -> list[tuple[str, int, bool]]:
    return [(c.seq.request_id, c.num_tokens, c.samples) for c in output.chunks]


def test_a_burst_of_short_prompts_gets_first_tokens_in_turn_not_at_the_end_of_one_long_step():
    scheduler = make(num_blocks=512, block_size=16, max_num_batched_tokens=512, step_tokens_after_a_finished_prompt=128)
    for i in range(6):
        scheduler.add(FakeSequence(f"q{i}", list(range(80))))
    first = run_step(scheduler)
    # 80 tokens finish q0 but the step holds fewer than 128, so q1 joins; 160 >= 128 ends the step.
    assert step_plan(first) == [("q0", 80, True), ("q1", 80, True)]
    assert first.num_prompts_finished == 2
    second = run_step(scheduler)
    assert [(rid, n, s) for rid, n, s in step_plan(second) if n > 1] == [("q2", 80, True), ("q3", 80, True)]
    assert [rid for rid, n, _ in step_plan(second) if n == 1] == ["q0", "q1"]  # the decodes all run


def test_a_long_prompt_still_fills_the_whole_budget_until_its_last_chunk():
    scheduler = make(num_blocks=512, block_size=16, max_num_batched_tokens=512, step_tokens_after_a_finished_prompt=128)
    scheduler.add(FakeSequence("long", list(range(1000))))
    scheduler.add(FakeSequence("next", list(range(300))))
    assert step_plan(run_step(scheduler)) == [("long", 512, False)]
    # The long prompt's last 488 tokens finish it; the step already holds >= 128, so "next" waits.
    assert step_plan(run_step(scheduler)) == [("long", 488, True)]
    assert step_plan(run_step(scheduler)) == [("long", 1, True), ("next", 300, True)]


def test_short_prompts_below_the_threshold_and_steps_that_finish_no_prompt_fill_the_budget():
    scheduler = make(num_blocks=512, block_size=16, max_num_batched_tokens=512, step_tokens_after_a_finished_prompt=128)
    for i in range(3):
        scheduler.add(FakeSequence(f"q{i}", list(range(10))))
    scheduler.add(FakeSequence("long", list(range(1000))))
    # Three finished prompts hold 30 tokens (< 128), so the long prompt's first chunk takes the rest.
    short = [("q0", 10, True), ("q1", 10, True), ("q2", 10, True)]
    assert step_plan(run_step(scheduler)) == [*short, ("long", 482, False)]
    # Three decodes and a chunk that does not finish the long prompt: the whole budget again.
    decodes = [("q0", 1, True), ("q1", 1, True), ("q2", 1, True)]
    assert step_plan(run_step(scheduler)) == [*decodes, ("long", 509, False)]


def test_a_threshold_at_the_budget_keeps_the_plain_budget_rule():
    scheduler = make(num_blocks=512, block_size=16, max_num_batched_tokens=512, step_tokens_after_a_finished_prompt=512)
    for i in range(6):
        scheduler.add(FakeSequence(f"q{i}", list(range(80))))
    assert [n for _, n, _ in step_plan(run_step(scheduler))] == [80] * 6


def test_a_prompt_whose_prefix_a_running_prompt_is_computing_waits_and_then_hits_the_cache():
    scheduler = make(num_blocks=32, block_size=4, caching=True, max_num_batched_tokens=24)
    first = FakeSequence("a", [*range(16), 70], max_tokens=1)
    twin = FakeSequence("b", [*range(16), 80], max_tokens=1)  # the same 16-token prefix
    other = FakeSequence("c", [90, 91, 92], max_tokens=1)  # nothing shared: never held back
    for seq in (first, twin, other):
        scheduler.add(seq)
    output = run_step(scheduler)
    # "b" would miss the block "a" is computing: it waits; "c" behind it is admitted meanwhile.
    assert [c.seq.request_id for c in output.chunks] == ["a", "c"]
    assert list(scheduler.waiting) == [twin]
    while twin.num_cached_tokens is None:
        run_step(scheduler)
    assert twin.num_cached_tokens == 16  # every block of the prefix came from the cache
    assert twin.block_table[:4] == first.block_table[:4]


def test_without_caching_nothing_waits_for_a_running_prefill():
    scheduler = make(num_blocks=32, block_size=4, caching=False, max_num_batched_tokens=64)
    first = FakeSequence("a", [*range(16), 70], max_tokens=1)
    twin = FakeSequence("b", [*range(16), 80], max_tokens=1)
    scheduler.add(first)
    scheduler.add(twin)
    run_step(scheduler)
    assert not scheduler.waiting and twin in scheduler.running


def test_a_queued_prompt_is_announced_and_settles_after_its_blocks_are_stored():
    scheduler = make(num_blocks=32, caching=True, max_num_batched_tokens=8)
    manager = scheduler.block_manager
    seq = FakeSequence("a", list(range(1, 14)))  # 13 tokens: 3 full blocks of 4 before the last token
    scheduler.add(seq)
    (announced,) = manager.drain_events()
    assert announced == PrefixAnnounced(seq.handle, tuple(seq.prefix.hashes[:3]))
    run_step(scheduler)  # 8 of 13 prompt tokens: two blocks stored, still pending
    assert [type(e) for e in manager.drain_events()] == [BlockStored, BlockStored]
    run_step(scheduler)  # the rest: the third block, then the settlement
    assert manager.drain_events() == [BlockStored(announced.block_hashes[2], announced.block_hashes[1], 4),
                                      PrefixSettled(seq.handle)]  # fmt: skip
    run_step(scheduler)
    assert not any(isinstance(e, PrefixSettled) for e in manager.drain_events())  # settled once


def test_an_aborted_or_unhashable_prompt_settles_or_is_never_announced():
    scheduler = make(num_blocks=32, caching=True)
    manager = scheduler.block_manager
    queued = FakeSequence("queued", list(range(1, 10)))
    scheduler.add(queued)
    scheduler.abort(queued.handle)
    assert [type(e) for e in manager.drain_events()] == [PrefixAnnounced, PrefixSettled]
    scheduler.add(FakeSequence("short", [1, 2, 3, 4]))  # no full block before its last token
    scheduler.add(FakeSequence("scored", list(range(1, 10)), sampling=SamplingParams(prompt_logprobs=0)))
    assert manager.drain_events() == []  # prompt logprobs never read the cache
    uncached = make(num_blocks=32, caching=False)
    uncached.add(FakeSequence("plain", list(range(1, 10))))
    assert uncached.block_manager.drain_events() == []
