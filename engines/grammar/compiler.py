"""Compiles grammars for one tokenizer on threads of their own, and keeps the results.

Compilation never runs on the event loop nor on the engine's step loop: `submit` hands the work
to a small thread pool and returns a future, `compile` awaits it from asyncio, so other requests'
tokens keep coming while a schema compiles for seconds. They come slower meanwhile: the compile
takes a core, and xgrammar's compile loop checks for signals through tvm-ffi, which takes the GIL
each time (on the 2-core machine a thread spinning in Python ran at 35% of its rate beside a
compile thread, at full rate beside a compile process). Results, and refusals, are kept in a
`BoundedCache` keyed by (tokenizer fingerprint, kind, text); two requests for the same grammar
while it compiles share one compilation.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from engines.grammar.cache import BoundedCache
from engines.grammar.spec import GrammarKind, GrammarSpec
from engines.grammar.vocab import encoded_vocabulary, grammar_vocabulary, vocabulary_fingerprint
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
    """xgrammar's compiler over the model's vocabulary (special tokens as empty strings)."""

    def __init__(self, vocab: list[str], tokenizer: Any, eos_token_ids: frozenset[int]):
        import xgrammar as xgr

        self.vocab_size = len(vocab)
        self.compiler = xgr.GrammarCompiler(
            grammar_vocabulary(vocab, tokenizer, eos_token_ids), max_threads=1, cache_enabled=False
        )

    def compile(self, spec: GrammarSpec) -> Any:
        """An `xgrammar.CompiledGrammar`. JSON comes out compact (", " and ": ", no other
        whitespace): a small model left free to add whitespace can fill max_tokens with it."""
        if spec.kind is GrammarKind.JSON_SCHEMA:
            return self.compiler.compile_json_schema(spec.text, any_whitespace=False)
        if spec.kind is GrammarKind.JSON_OBJECT:
            return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        if spec.kind is GrammarKind.REGEX:
            return self.compiler.compile_regex(spec.text)
        return self.compiler.compile_grammar(spec.text)

    @staticmethod
    def size_of(compiled: Any) -> int:
        return int(compiled.memory_size_bytes)


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
        backend: Callable[[], Any] | None = None,
    ):
        vocab = encoded_vocabulary(tokenizer, vocab_size)
        self.vocab_size = vocab_size
        self.fingerprint = vocabulary_fingerprint(vocab, eos_token_ids)
        self._make_backend = backend or (lambda: XgrammarBackend(vocab, tokenizer, eos_token_ids))
        self._backend: Any = None
        self._backend_lock = threading.Lock()
        self._lock = threading.RLock()
        self._cache: BoundedCache[CacheKey, Future] = BoundedCache(max_entries, max_bytes)
        self._pending: dict[CacheKey, Future] = {}
        self._executor = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="dpgate-grammar")

    @property
    def num_cached(self) -> int:
        with self._lock:
            return len(self._cache)

    def key(self, spec: GrammarSpec) -> CacheKey:
        return (self.fingerprint, spec.kind, spec.text)

    def submit(self, spec: GrammarSpec) -> Future:
        """A future of the compiled grammar, or of an InvalidGrammarError; cached or shared when it can be."""
        key = self.key(spec)
        with self._lock:
            known = self._cache.get(key) or self._pending.get(key)
            if known is not None:
                return known
            future = self._executor.submit(self._compile, spec)
            self._pending[key] = future
        future.add_done_callback(lambda done: self._keep(key, done))
        return future

    async def compile(self, spec: GrammarSpec) -> Any:
        """Await the compiled grammar from the event loop. Shielded: a caller that goes away does
        not cancel a compilation other requests may share."""
        return await asyncio.shield(asyncio.wrap_future(self.submit(spec)))

    def prepare(self) -> None:
        """Build the backend now rather than on the first grammar (start-up, benchmarks)."""
        self._ensure_backend()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _ensure_backend(self) -> Any:
        with self._backend_lock:
            if self._backend is None:
                self._backend = self._make_backend()
            return self._backend

    def _compile(self, spec: GrammarSpec) -> Any:
        backend = self._ensure_backend()
        try:
            return backend.compile(spec)
        except (RuntimeError, ValueError) as error:  # xgrammar's refusals: parse and conversion errors
            raise InvalidGrammarError(f"{spec.field} does not compile: {_reason(error)}") from None

    def _keep(self, key: CacheKey, future: Future) -> None:
        with self._lock:
            self._pending.pop(key, None)
            if future.cancelled():
                return
            error = future.exception()
            if error is not None and not isinstance(error, InvalidGrammarError):
                return  # not the grammar's fault: let the next request try again
            size = _REFUSAL_BYTES if error is not None else self._backend.size_of(future.result())
            self._cache.put(key, future, size)


def _reason(error: Exception) -> str:
    """xgrammar's own message when it is one (a parse or conversion error), without its C++ source
    location; a sentence when it is an internal assertion or empty, which says nothing to a client."""
    reason = _CPP_LOCATION.sub("", str(error)).strip()
    if not reason or "Check failed" in reason:
        return "the grammar library could not convert it (an unsupported or contradictory construct)"
    return reason
