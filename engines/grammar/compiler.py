"""Compiles grammars for one tokenizer off the event loop, within a time budget, and keeps the results.

`submit` hands the work to a small thread pool and returns a future; `compile` awaits it from
asyncio, so other requests' tokens keep coming while a schema compiles. The real backend runs
xgrammar in child processes (worker_process.py), one per compile thread: xgrammar's C++ cannot be
interrupted inside a thread, and a schema nesting arrays 400 deep took 5.7 s to convert (900
deep: 59 s), so each compile gets `budget_s` (--grammar-compile-timeout-s) and a grammar over it is
refused (INVALID_ARGUMENT naming the field and the flag, cached like any refusal); and when every
caller waiting for a compile has gone, the child is killed and the work stops (issue 22). In a
child the compile no longer takes the engine's GIL either (a thread spinning in Python ran at 35%
of its rate beside a compile thread, at full rate beside a compile process). Results, and
refusals, are kept in a `BoundedCache` keyed by (tokenizer fingerprint, kind, text); two requests
for the same grammar while it compiles share one compilation.
"""

from __future__ import annotations

import asyncio
import queue
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from engines.grammar.cache import BoundedCache
from engines.grammar.limits import DEFAULT_COMPILE_BUDGET_S
from engines.grammar.spec import GrammarKind, GrammarSpec
from engines.grammar.vocab import encoded_vocabulary, grammar_vocabulary, vocabulary_fingerprint
from engines.grammar.worker_process import (
    GrammarBudgetExceeded,
    GrammarProcess,
    GrammarWorkCancelled,
    GrammarWorkerFailed,
)
from engines.sampling.params import InvalidRequestError

MAX_CACHED_GRAMMARS = 256
MAX_CACHED_BYTES = 256 * 2**20  # xgrammar's own measure; a typical schema is 50-150 KB on a 49k vocabulary
COMPILE_THREADS = 2  # one slow grammar leaves a thread for the next; each compiles on one core
_REFUSAL_BYTES = 1024  # what a cached refusal is charged
_CPP_LOCATION = re.compile(r"^\s*\[[0-9:]+\]\s+\S+:\d+:\s*")

CacheKey = tuple[str, GrammarKind, str]


class InvalidGrammarError(InvalidRequestError):
    """The request's grammar does not compile; the message carries the compiler's reason."""


class XgrammarBackend:
    """xgrammar's compiler over the model's vocabulary (special tokens as empty strings), run in
    one child process per compile thread; compiled grammars come back serialized."""

    def __init__(
        self,
        vocab: list[str],
        tokenizer: Any,
        eos_token_ids: frozenset[int],
        budget_s: float = DEFAULT_COMPILE_BUDGET_S,
    ):
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = len(vocab)
        self.budget_s = budget_s
        self.info = grammar_vocabulary(vocab, tokenizer, eos_token_ids)
        setup = (_start_child_compiler, (self.info.serialize_json(),))
        self._processes: queue.SimpleQueue[GrammarProcess] = queue.SimpleQueue()
        self._all = [GrammarProcess(setup) for _ in range(COMPILE_THREADS)]
        for process in self._all:
            self._processes.put(process)

    def compile(self, spec: GrammarSpec, cancelled: threading.Event) -> Any:
        """An `xgrammar.CompiledGrammar`; raises InvalidGrammarError (the reason only),
        GrammarBudgetExceeded, GrammarWorkCancelled or GrammarWorkerFailed."""
        text = self.call(_compile_in_child, (spec.kind, spec.text), cancelled)
        return self._xgr.CompiledGrammar.deserialize_json(text, self.info)

    def call(self, function: Callable[..., Any], args: tuple[Any, ...], cancelled: threading.Event) -> Any:
        """`function(*args)` in a free child, within the budget."""
        process = self._processes.get()
        try:
            return process.call(function, args, self.budget_s, cancelled)
        finally:
            self._processes.put(process)

    @staticmethod
    def size_of(compiled: Any) -> int:
        return int(compiled.memory_size_bytes)

    def start_children(self) -> None:
        """Start every child now (each imports xgrammar: 2-20 s on a busy machine), taking each
        from the pool so none is started twice or while in use."""
        taken = [self._processes.get() for _ in self._all]
        try:
            for process in taken:
                process.ensure_started()
        finally:
            for process in taken:
                self._processes.put(process)

    def shutdown(self) -> None:
        for process in self._all:
            process.kill()


_child_compiler: Any = None  # in a child process: its xgrammar compiler


def _start_child_compiler(tokenizer_info_json: str) -> None:
    """Runs once in each child: the same vocabulary as the parent's, from its serialized form."""
    global _child_compiler
    import xgrammar as xgr

    info = xgr.TokenizerInfo.deserialize_json(tokenizer_info_json)
    _child_compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def _compile_in_child(kind: GrammarKind, text: str) -> str:
    """Runs in a child: the compiled grammar, serialized. JSON comes out compact (", " and ": ", no
    other whitespace): a small model left free to add whitespace can fill max_tokens with it."""
    compiler = _child_compiler
    try:
        if kind is GrammarKind.JSON_SCHEMA:
            compiled = compiler.compile_json_schema(text, any_whitespace=False)
        elif kind is GrammarKind.JSON_OBJECT:
            compiled = compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        elif kind is GrammarKind.REGEX:
            compiled = compiler.compile_regex(text)
        else:
            compiled = compiler.compile_grammar(text)
    except (RuntimeError, ValueError) as error:  # xgrammar's refusals: parse and conversion errors
        raise InvalidGrammarError(_reason(error)) from None
    return compiled.serialize_json()


class GrammarCompiler:
    """One per served tokenizer. `backend` builds the compiler on first use, on a compile thread
    (tests pass their own)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        *,
        max_entries: int = MAX_CACHED_GRAMMARS,
        max_bytes: int = MAX_CACHED_BYTES,
        budget_s: float = DEFAULT_COMPILE_BUDGET_S,
        backend: Callable[[], Any] | None = None,
    ):
        vocab = encoded_vocabulary(tokenizer, vocab_size)
        self.vocab_size = vocab_size
        self.budget_s = budget_s
        self.fingerprint = vocabulary_fingerprint(vocab, eos_token_ids)
        self._make_backend = backend or (lambda: XgrammarBackend(vocab, tokenizer, eos_token_ids, budget_s))
        self._backend: Any = None
        self._backend_lock = threading.Lock()
        self._lock = threading.RLock()
        self._cache: BoundedCache[CacheKey, Future] = BoundedCache(max_entries, max_bytes)
        self._pending: dict[CacheKey, _Compilation] = {}
        self._executor = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="dpgate-grammar")

    @property
    def num_cached(self) -> int:
        with self._lock:
            return len(self._cache)

    @property
    def num_pending(self) -> int:
        """Compilations queued or running: they count toward the engine's --max-waiting."""
        with self._lock:
            return len(self._pending)

    def key(self, spec: GrammarSpec) -> CacheKey:
        return (self.fingerprint, spec.kind, spec.text)

    def submit(self, spec: GrammarSpec) -> Future:
        """A future of the compiled grammar, or of an InvalidGrammarError; cached or shared when it can be."""
        return self._start(spec)[0]

    def _start(self, spec: GrammarSpec) -> tuple[Future, _Compilation | None]:
        key = self.key(spec)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                return cached, None
            pending = self._pending.get(key)
            if pending is not None and not pending.cancelled.is_set():
                return pending.future, pending
            compilation = _Compilation(threading.Event())
            compilation.future = self._executor.submit(self._compile, spec, compilation.cancelled)
            self._pending[key] = compilation
        compilation.future.add_done_callback(lambda done: self._keep(key, compilation))
        return compilation.future, compilation

    async def compile(self, spec: GrammarSpec) -> Any:
        """Await the compiled grammar from the event loop. A compilation is shared by every request
        waiting for the same grammar; when the last of them goes away it is stopped."""
        future, compilation = self._start(spec)
        if compilation is None:
            return await asyncio.wrap_future(future)
        with self._lock:
            compilation.num_waiters += 1
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        finally:
            with self._lock:
                compilation.num_waiters -= 1
                if compilation.num_waiters == 0 and not future.done():
                    compilation.cancelled.set()  # the child is killed at its next poll
                    future.cancel()  # or, not started yet, it never starts

    def run(self, function: Callable[..., Any], args: tuple[Any, ...], cancelled: threading.Event) -> Any:
        """`function(*args)` on the grammar backend's children, within the compile budget, from a
        thread that may block (request preparation): building a tool-call grammar converts its
        schemas with xgrammar, as slow as a compile for a deeply nested one. Raises the function's
        InvalidRequestError, or InvalidRequestError when the budget is spent."""
        backend = self._ensure_backend()
        if not hasattr(backend, "call"):  # an in-thread backend (tests): no budget to keep
            return function(*args)
        try:
            return backend.call(function, args, cancelled)
        except GrammarBudgetExceeded:
            raise InvalidRequestError(
                f"tools: the tool-call grammar did not build within {self.budget_s:g} s "
                "(--grammar-compile-timeout-s); simplify the tools' parameters"
            ) from None

    def prepare(self) -> None:
        """Build the backend now rather than on the first grammar (start-up, benchmarks)."""
        self._ensure_backend()

    def warm_up(self) -> None:
        """The backend and its child processes, started before the first grammar asks (the engine
        runs this on a thread at start-up), so no request waits for them."""
        backend = self._ensure_backend()
        if hasattr(backend, "start_children"):
            backend.start_children()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for compilation in self._pending.values():
                compilation.cancelled.set()
        if self._backend is not None and hasattr(self._backend, "shutdown"):
            self._backend.shutdown()

    def _ensure_backend(self) -> Any:
        with self._backend_lock:
            if self._backend is None:
                self._backend = self._make_backend()
            return self._backend

    def _compile(self, spec: GrammarSpec, cancelled: threading.Event) -> Any:
        if cancelled.is_set():
            raise GrammarWorkCancelled("the grammar's callers went away")
        backend = self._ensure_backend()
        try:
            return backend.compile(spec, cancelled)
        except GrammarBudgetExceeded:
            raise InvalidGrammarError(
                f"{spec.field} did not compile within {self.budget_s:g} s (--grammar-compile-timeout-s); "
                "simplify it (deep nesting makes the grammar's conversion grow steeply)"
            ) from None
        except (GrammarWorkCancelled, GrammarWorkerFailed):
            raise
        except (RuntimeError, ValueError) as error:  # xgrammar's refusals: parse and conversion errors
            raise InvalidGrammarError(f"{spec.field} does not compile: {_reason(error)}") from None

    def _keep(self, key: CacheKey, compilation: _Compilation) -> None:
        future = compilation.future
        with self._lock:
            if self._pending.get(key) is compilation:
                del self._pending[key]
            if future.cancelled():
                return
            error = future.exception()
            if error is not None and not isinstance(error, InvalidGrammarError):
                return  # not the grammar's fault (or stopped): let the next request try again
            size = _REFUSAL_BYTES if error is not None else self._backend.size_of(future.result())
            self._cache.put(key, future, size)


@dataclass(slots=True)
class _Compilation:
    """One grammar being compiled, shared by the requests that wait for it."""

    cancelled: threading.Event
    future: Future = field(default_factory=Future)
    num_waiters: int = 0


def _reason(error: Exception) -> str:
    """xgrammar's own message when it is one (a parse or conversion error), without its C++ source
    location; a sentence when it is an internal assertion or empty, which says nothing to a client."""
    reason = _CPP_LOCATION.sub("", str(error)).strip()
    if not reason or "Check failed" in reason:
        return "the grammar library could not convert it (an unsupported or contradictory construct)"
    return reason
