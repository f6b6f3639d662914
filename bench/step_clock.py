"""A transformers logits processor that only records when each generation step's logits are
ready: the benches time transformers' `generate` per token with it, without changing its output."""

from __future__ import annotations

import time


class StepClock:
    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores
