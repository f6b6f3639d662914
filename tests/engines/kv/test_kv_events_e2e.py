"""WatchKvEvents over real gRPC: 1,000 random requests on a small KV cache (evictions all along)
with two subscribers, one of which disconnects and reconnects mid-way; afterwards each mirror
equals the engine's cached set (a fresh snapshot, GetLoad's count), sequence numbers never skip
without a snapshot, and a block hash computed by this test from token ids by the documented
formula is in the set. Every request's prompt is announced once with its block hashes and settled
only after those blocks' stored events, so nothing is left pending at the end."""

from __future__ import annotations

import hashlib
import random
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from tests.engines.kv.prefix_exactness import load, server_info
from tests.support.processes import free_port, running
from tests.tiny_model import make_tiny_llama_dir


def documented_hash(parent: int, tenant: str, salt: str, tokens: list[int]) -> int:
    """control.proto's KvBlock formula, written out again here on purpose."""
    t, s = tenant.encode(), salt.encode()
    extra = struct.pack("<I", len(t)) + t + struct.pack("<I", len(s)) + s
    data = struct.pack("<Q", parent) + struct.pack("<I", len(extra)) + extra
    data += b"".join(struct.pack("<I", token) for token in tokens)
    return struct.unpack("<Q", hashlib.sha256(data).digest()[:8])[0]


class Mirror:
    """A subscriber: applies snapshot and events, checks numbering; `stop_after` cancels its call."""

    def __init__(self, address: str):
        self.address = address
        self.blocks: dict[int, tuple[int, int]] = {}
        self.last = -1
        self.incarnations: set[str] = set()
        self.num_snapshots = 0
        self.num_removed = 0
        self.pending: dict[int, tuple[int, ...]] = {}  # announced, not settled
        self.announced: list[tuple[int, ...]] = []  # every announcement's chain, in order
        self.settled_before_stored = 0
        self.lock = threading.Lock()
        self.call = None

    def follow(self, stop_after: int | None = None) -> None:
        """Read the stream until `stop_after` messages, or until `self.call` is cancelled."""
        with grpc.insecure_channel(self.address) as channel:
            call = self.call = control_pb2_grpc.ControlServiceStub(channel).WatchKvEvents(cpb.WatchKvEventsRequest())
            try:
                for count, message in enumerate(call, 1):
                    self.apply(message)
                    if stop_after is not None and count >= stop_after:
                        call.cancel()
                        return
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.CANCELLED, error

    def apply(self, message: cpb.WatchKvEventsResponse) -> None:
        with self.lock:
            self.incarnations.add(message.incarnation_id)
            kind = message.WhichOneof("kind")
            if kind == "snapshot":
                self.blocks = {b.block_hash: (b.parent_hash, b.num_tokens) for b in message.snapshot.blocks}
                self.pending = {p.key: tuple(p.block_hashes) for p in message.snapshot.pending}
                self.num_snapshots += 1
            else:
                assert message.sequence_number == self.last + 1, "a gap without a snapshot"
                if kind == "stored":
                    block = message.stored.block
                    self.blocks[block.block_hash] = (block.parent_hash, block.num_tokens)
                elif kind == "removed":
                    del self.blocks[message.removed.block_hash]
                    self.num_removed += 1
                elif kind == "announced":
                    prefix = message.announced.prefix
                    assert prefix.key not in self.pending, "announced twice"
                    self.pending[prefix.key] = chain = tuple(prefix.block_hashes)
                    self.announced.append(chain)
                elif kind == "settled":
                    chain = self.pending.pop(message.settled.key)  # KeyError: settled, never announced
                    self.settled_before_stored += not all(block in self.blocks for block in chain)
                else:
                    assert kind == "cleared", kind
                    self.blocks.clear()
            self.last = message.sequence_number


def test_two_subscribers_one_reconnecting_mirror_the_cache_through_1000_requests(tmp_path):
    model = make_tiny_llama_dir(tmp_path / "tiny", seed=9)
    port = free_port()
    args = ["engine", "--port", str(port), "--model", str(model), "--num-kv-blocks", "48", "--max-model-len", "256"]
    rng = random.Random(4)
    prefixes = [[rng.randrange(100, 40000) for _ in range(64)] for _ in range(6)]
    prompts = [
        rng.choice(prefixes)[: rng.randrange(1, 65)] + [rng.randrange(100, 40000) for _ in range(rng.randrange(20))]
        for _ in range(1000)
    ]
    with running(args, port, timeout=180, log_path=str(tmp_path / "engine.log")) as engine:
        steady, reconnecting = Mirror(engine.address), Mirror(engine.address)
        first_follow = threading.Thread(target=reconnecting.follow, kwargs={"stop_after": 40})
        followers = [threading.Thread(target=steady.follow), first_follow]
        for thread in followers:
            thread.start()
        with grpc.insecure_channel(engine.address) as channel:
            stub = generate_pb2_grpc.InferenceServiceStub(channel)

            def generate(prompt: list[int]) -> None:
                stopping = pb.StoppingCriteria(max_tokens=2, ignore_eos=True)
                stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), stopping=stopping), timeout=120)

            with ThreadPoolExecutor(6) as pool:
                list(pool.map(generate, prompts[:500]))
                first_follow.join(60)
                followers.append(threading.Thread(target=reconnecting.follow))
                followers[-1].start()  # reconnects mid-way: a fresh snapshot, then events
                list(pool.map(generate, prompts[500:]))
            probe = prefixes[0][:33]
            generate(probe)  # its first two blocks are cached now, and nothing runs after it
        final = Mirror(engine.address)
        final.follow(stop_after=1)  # a fresh subscriber's snapshot: the engine's set now
        deadline = time.monotonic() + 30
        while min(steady.last, reconnecting.last) < final.last and time.monotonic() < deadline:
            time.sleep(0.05)
        cached_count = load(engine.address).num_cached_blocks
        root = server_info(engine.address).prefix_cache_root_hash
        for mirror in (steady, reconnecting):
            mirror.call.cancel()
        for thread in followers:
            thread.join(60)
    assert steady.last == reconnecting.last == final.last
    assert steady.blocks == reconnecting.blocks == final.blocks
    assert len(final.blocks) == cached_count and steady.num_removed > 100
    assert steady.num_snapshots == 1 and reconnecting.num_snapshots == 2
    assert len(steady.incarnations | reconnecting.incarnations | final.incarnations) == 1
    first = documented_hash(root, "", "", probe[:16])
    assert first in final.blocks and documented_hash(first, "", "", probe[16:32]) in final.blocks
    assert final.blocks[first] == (root, 16)
    # every prompt with a full block before its last token was announced, and all settled
    assert len(steady.announced) == sum((len(p) - 1) // 16 > 0 for p in [*prompts, probe])
    assert steady.pending == reconnecting.pending == final.pending == {}
    assert steady.announced[-1] == (first, documented_hash(first, "", "", probe[16:32]))
    assert steady.settled_before_stored == reconnecting.settled_before_stored == 0
