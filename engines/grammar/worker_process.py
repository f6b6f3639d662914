"""Grammar work in a child process, so it can be given a time budget and be stopped.

xgrammar's conversion and compile run in C++ and cannot be interrupted inside a thread: a JSON
schema nesting arrays 400 deep took 5.7 s to convert, 900 deep 59 s (issue 22), and a cancelled
compile kept its thread for as long. Here the work runs in `python -m engines.grammar.worker_process`
(a plain subprocess, like the TP workers: nothing of the engine's main module is shared); the
caller waits on the child's pipe in short polls and, when the budget is spent or the caller has
gone, kills the child. A killed child is replaced on the next call (about 2-6 s to import
xgrammar again, paid by that call only).

Protocol: length-prefixed pickles. The parent sends `(function, args)`, where the function is a
module-level function (pickled by reference); the child answers `("ok", result)`, `("refused",
InvalidRequestError)` or `("failed", message)`. The child exits when its standard input closes, so
none outlives its engine.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from engines.sampling.params import InvalidRequestError

_HEADER = struct.Struct("<Q")
POLL_S = 0.05  # how often a waiting caller checks its budget and whether it was cancelled


class GrammarWorkCancelled(RuntimeError):
    """Everyone waiting for this grammar went away; the work was stopped."""


class GrammarBudgetExceeded(RuntimeError):
    """The work ran past its time budget and was stopped."""


class GrammarWorkerFailed(RuntimeError):
    """The child failed for a reason of its own (not the grammar's): not cached, retried next time."""


class GrammarProcess:
    """One child. `call` runs one function in it at a time (callers hold it through a pool)."""

    def __init__(self, setup: tuple[Callable[..., Any], tuple[Any, ...]] | None = None):
        self._setup = setup  # run once in each new child, e.g. building its xgrammar compiler
        self._process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def call(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        budget_s: float,
        cancelled: threading.Event,
    ) -> Any:
        """`function(*args)` in the child. Raises the child's InvalidRequestError, or
        GrammarBudgetExceeded / GrammarWorkCancelled (the child is killed), or GrammarWorkerFailed."""
        process = self.ensure_started()
        deadline = time.monotonic() + budget_s
        try:
            _write(process.stdin, (function, args))
            while True:
                if cancelled.is_set():
                    self.kill()
                    raise GrammarWorkCancelled("the grammar's callers went away")
                if time.monotonic() >= deadline:
                    self.kill()
                    raise GrammarBudgetExceeded(f"took longer than {budget_s:g} s")
                ready, _, _ = select.select([process.stdout], [], [], POLL_S)
                if ready:
                    status, value = _read(process.stdout)
                    break
        except (OSError, EOFError, pickle.UnpicklingError) as error:
            self.kill()
            raise GrammarWorkerFailed(f"the grammar worker process failed: {error}") from None
        if status == "ok":
            return value
        if status == "refused":
            raise value
        raise GrammarWorkerFailed(str(value))

    def kill(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        if process is not None:
            for pipe in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):  # a pipe to a killed child may fail to flush
                    pipe.close()

    def ensure_started(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self.kill()
        process = subprocess.Popen(
            [sys.executable, "-m", "engines.grammar.worker_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._process = process
        if self._setup is not None:
            _write(process.stdin, self._setup)
            status, value = _read(process.stdout)
            if status != "ok":
                self.kill()
                raise GrammarWorkerFailed(f"the grammar worker process did not start: {value}")
        return process


def _write(pipe: BinaryIO, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_HEADER.pack(len(data)) + data)
    pipe.flush()


def _read(pipe: BinaryIO) -> Any:
    header = _read_exactly(pipe, _HEADER.size)
    return pickle.loads(_read_exactly(pipe, _HEADER.unpack(header)[0]))


def _read_exactly(pipe: BinaryIO, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = pipe.read(remaining)
        if not chunk:
            raise EOFError("the grammar worker process closed its pipe")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """The child's loop: one call at a time until the parent closes standard input."""
    while True:
        try:
            function, args = _read(requests)
        except EOFError:
            return
        try:
            answer = ("ok", function(*args))
        except InvalidRequestError as refusal:
            answer = ("refused", refusal)
        except Exception as error:  # reported to the parent, which retries with a new child
            answer = ("failed", f"{type(error).__name__}: {error}")
        _write(answers, answer)


def main() -> None:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by libraries goes to stderr, never into the answers
    _serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
