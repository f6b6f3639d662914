"""Timing transformers' `generate` per token: a logits processor that only records when each
step's logits are ready, and the greedy, fixed-length generate call both benches make with it."""

from __future__ import annotations

import time


class StepClock:
    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def timed_greedy_generate(model, input_ids, num_tokens: int) -> StepClock:
    """Generate exactly `num_tokens` greedy tokens after each row of `input_ids`; return the clock."""
    import torch
    from transformers import LogitsProcessorList

    clock = StepClock()
    with torch.inference_mode():
        model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList([clock]),
        )
    return clock
