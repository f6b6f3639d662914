"""Following every engine's WatchKvEvents stream into the gateway's exact prefix-cache index.

One task per connected engine that keeps a prefix cache. Each (re)subscription starts with a
snapshot that replaces what the index knew of that engine; events then edit it in order. When a
stream ends (the engine stopped, restarted, or the channel was replaced) the engine's entries are
dropped at once, because nothing it held is known any more, and the task subscribes again after a
short pause; the next snapshot (of a new incarnation, after a restart) rebuilds them. An engine that
leaves the gateway (retired, refused) has its task cancelled and its entries dropped.

Each gateway replica follows the engines on its own, so every replica holds the same exact index,
and the same view of the prompts the engines announced as queued (`announced`: every replica's
calls, not only its own, count as prefixes on their way in).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import grpc
from prometheus_client import Histogram

from dpgate.v1 import control_pb2
from gateway.engine_client import EngineClient
from gateway.routing.in_flight import AnnouncedPrefixes, InFlightPrefixes
from gateway.routing.kv_index import KvIndex

logger = logging.getLogger("dpgate.gateway.kv_watch")


@dataclass(slots=True)
class StreamState:
    """Where one engine's stream stands: its incarnation, last sequence number, last message time."""

    incarnation_id: str = ""
    sequence_number: int = -1
    received_at: float = 0.0
    num_snapshots: int = 0


class KvWatch:
    """Owns the per-engine follower tasks and the index they feed."""

    def __init__(
        self,
        index: KvIndex,
        retry_s: float = 0.5,
        lag: Histogram | None = None,
        announced: AnnouncedPrefixes | None = None,
    ) -> None:
        self.index = index
        self.announced = announced if announced is not None else AnnouncedPrefixes(InFlightPrefixes())
        self._lag = lag  # observes each message's age (engine clock to ours), when given
        self.retry_s = retry_s
        self.states: dict[str, StreamState] = {}
        self._tasks: dict[str, asyncio.Task] = {}

    def is_watching(self, address: str) -> bool:
        return address in self._tasks

    def start(self, engine: EngineClient) -> None:
        """Follow `engine` unless already following it."""
        if engine.address in self._tasks:
            return
        task = asyncio.get_running_loop().create_task(self._follow(engine), name=f"kv events {engine.address}")
        self._tasks[engine.address] = task

    def stop(self, address: str) -> None:
        """Stop following `address` and forget what it held."""
        task = self._tasks.pop(address, None)
        if task is not None:
            task.cancel()
        self.states.pop(address, None)
        self.index.drop(address)
        self.announced.drop(address)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow(self, engine: EngineClient) -> None:
        address = engine.address
        while True:
            call = engine.watch_kv_events()
            try:
                async for message in call:
                    if not self._apply(address, message):
                        break  # out of order: subscribe again for a fresh snapshot
            except grpc.aio.AioRpcError as error:
                logger.debug("kv events from %s ended: %s", address, error.code().name)
            except asyncio.CancelledError:
                # The pool closed the channel under the call (it replaces the channels of an
                # unreachable engine): the call is cancelled, not this task; subscribe again.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
            except grpc.aio.UsageError:
                pass  # the call was started on a channel closed just before: take the new one
            finally:
                call.cancel()
                self.index.drop(address)
                self.announced.drop(address)
                self.states.pop(address, None)
            await asyncio.sleep(self.retry_s)

    def _apply(self, address: str, message: control_pb2.WatchKvEventsResponse) -> bool:
        """Apply one message; False when it cannot follow what came before (resubscribe)."""
        state = self.states.setdefault(address, StreamState())
        kind = message.WhichOneof("kind")
        now = time.monotonic()
        if kind == "snapshot":
            self.index.replace(address, (block.block_hash for block in message.snapshot.blocks))
            self.announced.replace(address, ((p.key, p.block_hashes) for p in message.snapshot.pending))
            state.incarnation_id = message.incarnation_id
            state.num_snapshots += 1
        elif message.incarnation_id != state.incarnation_id or message.sequence_number != state.sequence_number + 1:
            logger.warning("kv events from %s out of order; subscribing again", address)
            return False
        elif kind == "stored":
            self.index.add(address, message.stored.block.block_hash)
        elif kind == "removed":
            self.index.remove(address, message.removed.block_hash)
        elif kind == "announced":
            self.announced.announce(address, message.announced.prefix.key, message.announced.prefix.block_hashes)
        elif kind == "settled":
            self.announced.settle(address, message.settled.key)
        elif kind == "cleared":
            self.index.clear(address)
        state.sequence_number = message.sequence_number
        state.received_at = now
        if self._lag is not None and message.sent_unix_nanos:
            self._lag.observe(max(0.0, time.time() - message.sent_unix_nanos / 1e9))
        return True
