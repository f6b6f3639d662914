"""How many CPU threads the engine steps with: measured at start-up, so a second thread is kept
only where it makes steps faster.

Why measure rather than take every CPU: a step is hundreds of short parallel regions, and
libgomp's workers spin between them. On an idle machine the spinning pays (SmolLM2 at batch 1,
2 threads: 174 tok/s against 82 with one, Intel Xeon); on a machine whose CPUs other processes
also want, a spinning worker holds a CPU the other thread of its team needs, every region waits
for a thread the scheduler has parked, and two threads decode at a tenth of one thread's rate
(3-11 against 52-86 tok/s, the 2-vCPU EPYC VM with four other jobs). Letting the workers sleep
instead (OMP_WAIT_POLICY=passive) was never the best of the three: on the idle Xeon it gave 49
tok/s, on the busy EPYC 32-55. So the choice is between fewer threads and more spinning ones,
and which wins depends on the machine and its neighbours, which only a measurement sees.

The trial: after warm-up, on the thread that will step the engine, decode steps at one row and at
`batch_rows` rows, each candidate thread count in turn, `rounds` times interleaved so a burst of
load falls on every candidate alike; a candidate's score is the median over rounds of its summed
step times, and the fewest threads within `TIE` of the best score win (a thread that does not
clearly help is left to the neighbours). A candidate `DROP` times slower than the best in the
first round is not run again (on the busy VM two spinning threads took 2.4 s a step: three rounds
of them would add most of a minute to start-up). `--num-threads` skips the trial.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import torch

TIE = 0.03  # a candidate within 3% of the best is as good: fewer threads win
DROP = 2.0  # a candidate this many times slower than the best in the first round runs no more rounds


class ThreadSource(Enum):
    FLAG = "--num-threads"
    MEASURED = "measured at start-up"
    ONE_CPU = "one CPU"
    TENSOR_PARALLEL = "tensor parallel: CPUs shared out among the ranks"


@dataclass(frozen=True, slots=True)
class ThreadTrial:
    """One candidate's median step times over the rounds, in milliseconds."""

    num_threads: int
    one_row_ms: float
    batch_ms: float

    @property
    def score(self) -> float:
        return self.one_row_ms + self.batch_ms


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    num_threads: int
    source: ThreadSource
    usable_cpus: int
    batch_rows: int = 0
    trials: tuple[ThreadTrial, ...] = ()

    @property
    def wait_policy(self) -> str:
        """OpenMP's wait policy as this process's libgomp read it at load (it reads it only then)."""
        return os.environ.get("OMP_WAIT_POLICY", "default").lower()

    def describe(self) -> str:
        text = f"{self.num_threads} thread(s) of {self.usable_cpus} usable CPU(s), {self.source.value}"
        if self.trials:
            timings = "; ".join(
                f"{t.num_threads}: {t.one_row_ms:.1f} ms at 1 row, {t.batch_ms:.1f} ms at {self.batch_rows}"
                for t in self.trials
            )
            text += f" (median step times: {timings})"
        return f"{text}; OpenMP wait policy {self.wait_policy}"


def candidates(usable_cpus: int) -> list[int]:
    """Every CPU, then halves down to one: 2 -> [2, 1], 6 -> [6, 3, 1], 16 -> [16, 8, 4, 2, 1]."""
    counts, count = [], usable_cpus
    while count > 1:
        counts.append(count)
        count //= 2
    return [*counts, 1]


def pick(trials: Sequence[ThreadTrial]) -> ThreadTrial:
    best = min(trial.score for trial in trials)
    return min((t for t in trials if t.score <= best * (1 + TIE)), key=lambda t: t.num_threads)


def measure_threads(
    one_row_step: Callable[[], object],
    batch_step: Callable[[], object],
    counts: Sequence[int],
    rounds: int = 3,
    steps_per_round: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> list[ThreadTrial]:
    """Time the two steps at each thread count (on the calling thread: torch's thread count and
    OpenMP team are the calling thread's); leaves torch at the last count tried."""
    one_row: dict[int, list[float]] = {count: [] for count in counts}
    batch: dict[int, list[float]] = {count: [] for count in counts}
    running = list(counts)
    for round_ in range(rounds):
        if round_ == 1:  # a count twice as slow as the best cannot win: spare the start-up its rounds
            first = {count: one_row[count][0] + batch[count][0] for count in counts}
            running = [count for count in counts if first[count] <= DROP * min(first.values())]
        for count in running:
            torch.set_num_threads(count)
            one_row_step()  # the first region at a new count resizes the team: untimed
            started = clock()
            for _ in range(steps_per_round):
                one_row_step()
            one_row[count].append((clock() - started) / steps_per_round)
            started = clock()
            batch_step()
            batch[count].append(clock() - started)
    return [
        ThreadTrial(count, 1e3 * statistics.median(one_row[count]), 1e3 * statistics.median(batch[count]))
        for count in counts
    ]
