"""The synchronous engine core: a waiting queue, one running sequence, and `step()`.

Each step either prefills the next waiting sequence or decodes one token of the running one,
samples, and returns what the step produced. Requests run one at a time here; the scheduler
is the piece that will batch them.
"""

from __future__ import annotations

from collections import deque

from engines.model_runner import ModelRunner
from engines.sampler import sample
from engines.sequence import Sequence, StepOutput


class LLMEngine:
    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.waiting: deque[Sequence] = deque()
        self.running: Sequence | None = None

    @property
    def has_work(self) -> bool:
        return self.running is not None or bool(self.waiting)

    @property
    def num_running(self) -> int:
        return int(self.running is not None)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache holding the running sequence's tokens."""
        used = self.running.num_tokens if self.running is not None else 0
        return used / self.runner.max_model_len

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, request_id: str) -> StepOutput | None:
        """End a waiting or running request; None when it is not here (already finished)."""
        if self.running is not None and self.running.request_id == request_id:
            seq, self.running = self.running, None
            return seq.abort()
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                return seq.abort()
        return None

    def step(self) -> list[StepOutput]:
        if self.running is None:
            if not self.waiting:
                return []
            self.running = self.waiting.popleft()
            seq = self.running
            logits = self.runner.forward(seq.prompt_ids, 0)
        else:
            seq = self.running
            logits = self.runner.forward(seq.output_ids[-1:], seq.num_tokens - 1)
        sampled = sample(logits, seq.sampling, seq.generator, seq.prompt_ids, seq.output_ids, seq.blocked_token_ids)
        output = seq.append(sampled)
        if seq.is_finished:
            self.running = None
        return [output]
