"""Bridges the synchronous engine core to asyncio: one engine thread, typed commands in,
per-request output queues out.

The engine loop runs on an `EngineThread`: the server passes the one it loaded and warmed the
model on, so the steps run on the thread whose OpenMP team torch already has (engine_thread.py
says why a second team costs two thirds of the speed).

Synchronisation: the event loop never touches `LLMEngine`; it sends `AddRequest`/`AbortRequest`
commands (and `ResetPrefixCache`, answered through a future) through a thread-safe queue.
Requests are known by their `Sequence.handle`, never by the client's request_id: two calls may
carry the same id (a reused id right after a cancel, or two clients that picked the same one), and
each must read only its own outputs. The engine thread drains commands before every step and hands
the step's outputs back with one `loop.call_soon_threadsafe` a step (one wake-up of the loop,
however many requests the step advanced), so every per-request `asyncio.Queue` is only ever used
on the loop. Load figures are read from plain ints the engine thread publishes after each step.
Requests are built (validated, rendered, tokenized) on preparation threads, and a request with a
grammar is compiled by the grammar compiler (awaited here, on neither the loop nor the engine
thread) before the engine sees it, so a grammar that does not compile fails the call before any
token. The block manager's prefix-cache events go to `kv_events` (thread-safe) after every step
and every reset.
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
from engines.serving.engine_thread import EngineThread
from engines.serving.kv_events import KvEventLog
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
class ResetPrefixCache:
    done: asyncio.Future[int]  # set on the loop to the number of cached blocks forgotten


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


Command = AddRequest | AbortRequest | ResetPrefixCache | Shutdown


@dataclass(frozen=True, slots=True)
class BlockCounts:
    """The KV cache's blocks as the engine thread last saw them (GetLoad)."""

    num_used: int = 0
    num_cached_free: int = 0
    num_free: int = 0
    num_cached: int = 0
    num_query_tokens: int = 0
    num_hit_tokens: int = 0


class EngineFailedError(RuntimeError):
    """The engine thread raised; the request cannot complete."""


# Threads that validate, render and tokenize requests (and wait for tool-call grammars built in
# the grammar compiler's children): off the event loop, so a 4 MB prompt or a slow chat template
# never stalls health checks or the neighbours' streams.
PREPARE_THREADS = 2


class AsyncEngine:
    def __init__(
        self,
        engine: LLMEngine,
        loop: asyncio.AbstractEventLoop,
        grammars: GrammarCompiler | None = None,
        thread: EngineThread | None = None,
    ):
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
        self.blocks = BlockCounts(num_free=engine.block_manager.num_blocks)
        self.kv_events = KvEventLog()
        self.on_step = None  # optional callback(engine) after each step, for metrics
        self.thread = thread or EngineThread()
        self._loop_done = self.thread.submit(self._run)

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

    async def reset_prefix_cache(self) -> int:
        """Forget every cached block (on the engine thread, between steps); the number forgotten."""
        done: asyncio.Future[int] = self.loop.create_future()
        self.commands.put(ResetPrefixCache(done))
        return await done

    def shutdown(self) -> None:
        self.commands.put(Shutdown())
        self.thread.stop(timeout=10)
        self._prepare_pool.shutdown(wait=False, cancel_futures=True)

    def _deliver(self, output: StepOutput | BaseException, handle: int) -> None:
        stream = self.streams.get(handle)
        if stream is not None:  # None: its call has gone, and nobody else may read it
            stream.put_nowait(output)

    def _deliver_step(self, outputs: list[StepOutput]) -> None:
        for output in outputs:
            self._deliver(output, output.handle)

    def _send(self, output: StepOutput) -> None:
        self.loop.call_soon_threadsafe(self._deliver, output, output.handle)

    def _apply(self, command: Command) -> bool:
        """Apply one command; False means shut down."""
        if isinstance(command, Shutdown):
            return False
        if isinstance(command, ResetPrefixCache):
            forgotten = self.engine.block_manager.num_cached_blocks
            self.engine.reset_prefix_cache()
            self.loop.call_soon_threadsafe(_resolve, command.done, forgotten)
        elif isinstance(command, AddRequest):
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
                    outputs = self.engine.step()
                    # The step's cache events go out before its outputs: a client told that its
                    # request ended (a one-token answer ends in its prefill step) then finds the
                    # prompt's blocks in WatchKvEvents, never a snapshot from before them.
                    self._publish()
                    if outputs:
                        self.loop.call_soon_threadsafe(self._deliver_step, outputs)
                    if self.on_step is not None:
                        self.on_step(self.engine)
                else:
                    self._publish()
            except Exception as error:  # a failing step must not hang its clients
                logger.exception("engine step failed")
                self._fail_running(error)

    def _publish(self) -> None:
        """Load figures and prefix-cache events, after a step or a command (engine thread)."""
        self.num_running, self.num_waiting = self.engine.num_running, self.engine.num_waiting
        self.kv_usage = self.engine.kv_usage
        manager = self.engine.block_manager
        self.blocks = BlockCounts(
            manager.num_used_blocks,
            manager.num_cached_free_blocks,
            len(manager.free_blocks),
            manager.num_cached_blocks,
            manager.num_query_tokens,
            manager.num_hit_tokens,
        )
        self.kv_events.publish(manager.drain_events())

    def _fail_running(self, error: Exception) -> None:
        """A step raised: every running request ends with the error rather than hanging, and
        its blocks are freed; waiting requests keep their place."""
        for seq in list(self.engine.scheduler.running):
            self.engine.abort(seq.handle)
            self.loop.call_soon_threadsafe(self._deliver, error, seq.handle)


def _resolve(future: asyncio.Future[int], value: int) -> None:
    if not future.done():
        future.set_result(value)
