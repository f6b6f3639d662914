"""The start-up thread choice: candidates, the pick (fewest threads within the tie margin), the
trial's bookkeeping on a fake clock, and the engine's choice over a real tiny runner."""

from __future__ import annotations

import torch

from engines.runner.thread_choice import (
    ThreadChoice,
    ThreadSource,
    ThreadTrial,
    candidates,
    measure_threads,
    pick,
)


def test_candidates_are_every_cpu_then_halves_down_to_one():
    assert candidates(1) == [1]
    assert candidates(2) == [2, 1]
    assert candidates(6) == [6, 3, 1]
    assert candidates(16) == [16, 8, 4, 2, 1]


def test_the_fastest_wins_and_a_tie_goes_to_fewer_threads():
    assert pick([ThreadTrial(2, 5.0, 20.0), ThreadTrial(1, 9.0, 40.0)]).num_threads == 2
    assert pick([ThreadTrial(2, 12.0, 40.0), ThreadTrial(1, 8.0, 30.0)]).num_threads == 1
    # 2 threads 2% faster: within the tie margin, so the second thread is left to the neighbours
    assert pick([ThreadTrial(2, 9.8, 39.2), ThreadTrial(1, 10.0, 40.0)]).num_threads == 1


class FakeClock:
    """Advances by the cost of each step at the current torch thread count."""

    def __init__(self, one_row_ms: dict[int, float], batch_ms: dict[int, float]):
        self.now = 0.0
        self.one_row_ms, self.batch_ms = one_row_ms, batch_ms

    def __call__(self) -> float:
        return self.now

    def one_row(self) -> None:
        self.now += self.one_row_ms[torch.get_num_threads()] / 1e3

    def batch(self) -> None:
        self.now += self.batch_ms[torch.get_num_threads()] / 1e3


def test_the_trial_times_each_count_on_the_calling_thread():
    before = torch.get_num_threads()
    clock = FakeClock({1: 10.0, 2: 6.0}, {1: 40.0, 2: 25.0})
    try:
        trials = measure_threads(clock.one_row, clock.batch, [2, 1], rounds=3, steps_per_round=2, clock=clock)
    finally:
        torch.set_num_threads(before)
    assert [(t.num_threads, round(t.one_row_ms, 6), round(t.batch_ms, 6)) for t in trials] == [
        (2, 6.0, 25.0),
        (1, 10.0, 40.0),
    ]
    assert pick(trials).num_threads == 2


def test_the_choice_describes_itself_with_the_wait_policy(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    choice = ThreadChoice(1, ThreadSource.MEASURED, 2, 16, (ThreadTrial(2, 12.0, 40.0), ThreadTrial(1, 8.0, 30.0)))
    text = choice.describe()
    assert text.startswith("1 thread(s) of 2 usable CPU(s), measured at start-up")
    assert "2: 12.0 ms at 1 row, 40.0 ms at 16" in text
    assert text.endswith("OpenMP wait policy passive")
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert ThreadChoice(2, ThreadSource.FLAG, 2).describe() == (
        "2 thread(s) of 2 usable CPU(s), --num-threads; OpenMP wait policy default"
    )


def test_a_count_twice_as_slow_in_the_first_round_is_not_run_again():
    before = torch.get_num_threads()
    clock = FakeClock({1: 10.0, 2: 200.0}, {1: 40.0, 2: 400.0})
    calls = []
    one_row = lambda: (calls.append(torch.get_num_threads()), clock.one_row())  # noqa: E731
    try:
        trials = measure_threads(one_row, clock.batch, [2, 1], rounds=3, steps_per_round=2, clock=clock)
    finally:
        torch.set_num_threads(before)
    assert calls.count(2) == 3 and calls.count(1) == 9  # 2 threads: one round (warm-up step + 2 timed)
    assert pick(trials).num_threads == 1
