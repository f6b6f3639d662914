"""Bridges the synchronous engine core to asyncio: one engine thread, typed commands in,
per-request output queues out.

Synchronisation: the event loop never touches `LLMEngine`; it sends `AddRequest`/`AbortRequest`
commands through a thread-safe queue. Requests are known by their `Sequence.handle`, never by the
client's request_id: two calls may carry the same id (a reused id right after a cancel, or two
clients that picked the same one), and each must read only its own outputs. The engine thread
drains commands before every step and hands each `StepOutput` back with
`loop.call_soon_threadsafe`, so every per-request `asyncio.Queue` is only ever used on the loop.
Load figures are read from plain ints the engine thread publishes after each step. A request with
a grammar is compiled on the grammar compiler's threads (awaited here, on neither the loop nor the
engine thread) before the engine sees it, so a grammar that does not compile fails the call
before any token.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engines.engine import LLMEngine
from engines.scheduling.scheduler import QueueFullError, RequestTooLargeError
from engines.scheduling.sequence import Sequence, StepOutput
from engines.serving.request_builder import UnsupportedFeatureError

if TYPE_CHECKING:
    from engines.grammar.compiler import GrammarCompiler

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AddRequest:
    seq: Sequence


@dataclass(frozen=True, slots=True)
class AbortRequest:
    handle: int  # Sequence.handle


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


Command = AddRequest | AbortRequest | Shutdown


class EngineFailedError(RuntimeError):
    """The engine thread raised; the request cannot complete."""


# Threads that validate, render and tokenize requests (and wait for tool-call grammars built in
# the grammar compiler's children): off the event loop, so a 4 MB prompt or a slow chat template
# never stalls health checks or the neighbours' streams.
PREPARE_THREADS = 2


class AsyncEngine:
    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop, grammars: GrammarCompiler | None = None):
        self.engine = engine
        self.loop = loop
        self.grammars = grammars
        self.commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.streams: dict[int, asyncio.Queue[StepOutput | BaseException]] = {}  # by Sequence.handle
        self.handles: dict[str, set[int]] = {}  # client request_id -> live handles, for Control.Abort
        self.num_running = 0
        self.num_waiting = 0
        self.num_preparing = 0  # requests being built or waiting for their grammar: count as waiting
        self.max_waiting = engine.scheduler.config.max_waiting
        self._prepare_pool = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="dpgate-prepare")
        self.kv_usage = 0.0
        self.on_step = None  # optional callback(engine) after each step, for metrics
        self.thread = threading.Thread(target=self._run, name="dpgate-engine", daemon=True)
        self.thread.start()

    def is_active(self, request_id: str) -> bool:
        return request_id in self.handles

    async def run(self, build: Callable[[threading.Event], Sequence]) -> AsyncIterator[tuple[Sequence, StepOutput]]:
        """Build a request off the loop, compile its grammar, then yield (sequence, output) until it
        finishes. `build` gets an event set when the caller goes away (its grammar work stops).
        Requests being built or compiled count toward --max-waiting with those queued in the
        engine, so neither stage grows without bound."""
        if self.num_waiting + self.num_preparing >= self.max_waiting:
            raise QueueFullError(f"the engine's waiting queue is full ({self.max_waiting} requests)")
        self.num_preparing += 1
        try:
            seq = await self._prepare(build)
            if seq.grammar_spec is not None:
                await self._attach_grammar(seq)
        finally:
            self.num_preparing -= 1
        async for output in self.generate(seq):
            yield seq, output

    async def _prepare(self, build: Callable[[threading.Event], Sequence]) -> Sequence:
        cancelled = threading.Event()
        try:
            return await asyncio.wrap_future(self._prepare_pool.submit(build, cancelled))
        except asyncio.CancelledError:
            cancelled.set()  # a tool-call grammar being built for it stops; a queued build never starts
            raise

    async def generate(self, seq: Sequence) -> AsyncIterator[StepOutput]:
        """Yield the request's step outputs until it finishes. Leaving early (the client went
        away or the call was cancelled) aborts the request in the engine."""
        outputs: asyncio.Queue[StepOutput | BaseException] = asyncio.Queue()
        self.streams[seq.handle] = outputs
        self.handles.setdefault(seq.request_id, set()).add(seq.handle)
        finished = False
        try:
            if seq.grammar_spec is not None and seq.grammar is None:
                await self._attach_grammar(seq)
            self.commands.put(AddRequest(seq))
            while not finished:
                output = await outputs.get()
                if isinstance(output, QueueFullError | RequestTooLargeError):
                    raise output
                if isinstance(output, BaseException):
                    raise EngineFailedError(str(output)) from output
                finished = output.finish_reason is not None
                if output.error is not None:
                    raise output.error
                yield output
        finally:
            self._forget(seq)
            if not finished:
                self.commands.put(AbortRequest(seq.handle))

    def _forget(self, seq: Sequence) -> None:
        self.streams.pop(seq.handle, None)
        live = self.handles.get(seq.request_id)
        if live is not None:
            live.discard(seq.handle)
            if not live:
                del self.handles[seq.request_id]

    async def _attach_grammar(self, seq: Sequence) -> None:
        """Compile (or find cached) the request's grammar and give it its own matcher."""
        if self.grammars is None:
            raise UnsupportedFeatureError("structured_output needs a grammar compiler, and this engine has none")
        compiled = await self.grammars.compile(seq.grammar_spec)
        from engines.grammar.matcher import RequestGrammar  # xgrammar is loaded: the compile used it

        seq.grammar = RequestGrammar(compiled, seq.stop_token_ids, self.grammars.vocab_size)

    def abort(self, request_ids: list[str]) -> list[str]:
        """Ask the engine to end every live request carrying these client ids; returns the ids
        that had one."""
        active = [rid for rid in dict.fromkeys(request_ids) if rid in self.handles]
        for rid in active:
            for handle in self.handles[rid]:
                self.commands.put(AbortRequest(handle))
        return active

    def shutdown(self) -> None:
        self.commands.put(Shutdown())
        self.thread.join(timeout=10)
        self._prepare_pool.shutdown(wait=False, cancel_futures=True)

    def _deliver(self, output: StepOutput | BaseException, handle: int) -> None:
        stream = self.streams.get(handle)
        if stream is not None:  # None: its call has gone, and nobody else may read it
            stream.put_nowait(output)

    def _send(self, output: StepOutput) -> None:
        self.loop.call_soon_threadsafe(self._deliver, output, output.handle)

    def _apply(self, command: Command) -> bool:
        """Apply one command; False means shut down."""
        if isinstance(command, Shutdown):
            return False
        if isinstance(command, AddRequest):
            try:
                self.engine.add(command.seq)
            except (QueueFullError, RequestTooLargeError) as refusal:
                self.loop.call_soon_threadsafe(self._deliver, refusal, command.seq.handle)
        else:
            aborted = self.engine.abort(command.handle)
            if aborted is not None:
                self._send(aborted)
        return True

    def _run(self) -> None:
        while True:
            try:
                # Block only when idle; otherwise just drain what has arrived.
                pending = [] if self.engine.has_work else [self.commands.get()]
                while not self.commands.empty():
                    pending.append(self.commands.get_nowait())
                if not all(self._apply(command) for command in pending):
                    return
                if self.engine.has_work:
                    for output in self.engine.step():
                        self._send(output)
                    if self.on_step is not None:
                        self.on_step(self.engine)
                self.num_running, self.num_waiting = self.engine.num_running, self.engine.num_waiting
                self.kv_usage = self.engine.kv_usage
            except Exception as error:  # a failing step must not hang its clients
                logger.exception("engine step failed")
                self._fail_running(error)

    def _fail_running(self, error: Exception) -> None:
        """A step raised: every running request ends with the error rather than hanging, and
        its blocks are freed; waiting requests keep their place."""
        for seq in list(self.engine.scheduler.running):
            self.engine.abort(seq.handle)
            self.loop.call_soon_threadsafe(self._deliver, error, seq.handle)
