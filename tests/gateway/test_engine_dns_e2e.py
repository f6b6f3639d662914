"""`--engine-dns`: engines join and leave a headless service's DNS answer while calls flow.

Three synthetic engines listen on one port at 127.0.0.2, .3 and .4 (the loopback /8 is all this
machine's), like three pods behind one headless Service. A DNS server run by the test answers the
service's name; the test adds an engine to the answer (the gateway must route to it) and removes
one while calls run on it (it must finish them, take no new call, and no call may fail).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from grpc import aio

from dpgate.v1 import generate_pb2_grpc
from tests.gateway.dns_server import TestDnsServer
from tests.support.gateway_processes import (
    FAST_HEALTH,
    RANK_KEY,
    GatewayProcess,
    SyntheticEngineProcess,
    free_port,
    stream_request,
)
from tests.support.waiting import wait_for

SERVICE = "dpgate-engine.test"
INTERVAL_S = 0.2
TOKENS, TOKEN_DELAY_S = 10, 0.03  # each stream takes about 0.3 s: removals always meet calls in flight
NUM_CLIENTS = 6


class LoopbackEngine(SyntheticEngineProcess):
    """A synthetic engine on its own loopback address (the shared port is the Service's port)."""

    def __init__(self, host: str, port: int, rank: int, size: int, log_dir: Path) -> None:
        super().__init__(rank, size, log_dir, "--host", host, "--token-delay", str(TOKEN_DELAY_S))
        self.host, self.port = host, port
        self.log_path = log_dir / f"engine-{host}.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def served(self) -> float:
        return self.requests_total().get("GenerateStream", 0)


async def flow(address: str, stop: asyncio.Event, outcomes: list[str]) -> None:
    """NUM_CLIENTS clients, each streaming one call after another until `stop`; every outcome recorded."""
    async with aio.insecure_channel(address) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)

        async def client() -> None:
            while not stop.is_set():
                call = stub.GenerateStream(stream_request(TOKENS), timeout=20)
                try:
                    events = [message.WhichOneof("event") async for message in call]
                    ok = events[0] == "prompt_info" and events[-1] == "finish" and events.count("delta") >= 1
                    outcomes.append("ok" if ok else f"incomplete {events}")
                except aio.AioRpcError as error:
                    outcomes.append(f"{error.code().name}: {error.details()}")

        await asyncio.gather(*(client() for _ in range(NUM_CLIENTS)))


async def pinned_stream(address: str, rank: int, num_tokens: int) -> str:
    """One stream pinned to `rank`; its outcome as `flow` records it."""
    async with aio.insecure_channel(address) as channel:
        call = generate_pb2_grpc.InferenceServiceStub(channel).GenerateStream(
            stream_request(num_tokens), metadata=[(RANK_KEY, str(rank))], timeout=20
        )
        try:
            events = [message.WhichOneof("event") async for message in call]
        except aio.AioRpcError as error:
            return f"{error.code().name}: {error.details()}"
        return "ok" if events[-1] == "finish" and events.count("delta") == num_tokens else f"incomplete {events}"


def test_engines_join_and_leave_by_dns_while_calls_flow(log_dir):
    port = free_port()
    first, leaving, joining = (LoopbackEngine(f"127.0.0.{n + 2}", port, n, 3, log_dir) for n in range(3))
    engines = [first, leaving, joining]
    with TestDnsServer() as dns:
        dns.resolver.set(SERVICE, [first.host, leaving.host])
        for engine in engines:
            engine.start()
        gateway = None
        try:
            for engine in engines:
                engine.wait_serving()
            gateway = GatewayProcess(
                [], *FAST_HEALTH, "--engine-dns", f"{SERVICE}:{port}", "--dns-server", dns.address,
                "--engine-dns-interval", str(INTERVAL_S), "--shutdown-timeout", "10",
                log_dir=log_dir, name="gateway-engine-dns",
            )  # fmt: skip
            gateway.wait_ranks([0, 1], timeout=15)
            outcomes: list[str] = []

            async def scenario() -> None:
                stop = asyncio.Event()
                clients = asyncio.create_task(flow(gateway.address, stop, outcomes))
                await asyncio.to_thread(wait_for, lambda: leaving.served() >= 3, 10, "calls on the leaving engine")
                assert joining.served() == 0, "an engine outside the DNS answer was routed to"

                dns.resolver.set(SERVICE, [first.host, leaving.host, joining.host])
                await asyncio.to_thread(wait_for, lambda: joining.served() >= 3, 10, "calls on the joining engine")

                # Remove an engine while calls run on it: they must finish, and no new call may start there.
                # Two long streams pinned to its rank make sure the removal meets calls in flight.
                long_streams = [asyncio.create_task(pinned_stream(gateway.address, 1, 40)) for _ in range(2)]
                await asyncio.to_thread(wait_for, lambda: leaving.load().num_running >= 2, 5, "calls in flight")
                dns.resolver.set(SERVICE, [first.host, joining.host])
                retired = f"engine {leaving.address} (rank 1) retired"
                await asyncio.to_thread(wait_for, lambda: retired in gateway.log_path.read_text(), 10, retired)
                left = re.escape(f"engine {leaving.address} (rank 1) left DNS: retiring it after its ")
                drained = re.search(left + r"(\d+) calls in flight", gateway.log_path.read_text())
                assert drained is not None and int(drained.group(1)) >= 2, "the removal met no call in flight"
                outcomes.extend(await asyncio.gather(*long_streams))
                served_by_leaving = leaving.served()
                before = len(outcomes)
                await asyncio.sleep(1.0)  # calls keep flowing to the engines still in the answer
                stop.set()
                await clients
                assert len(outcomes) - before >= NUM_CLIENTS, "calls stopped flowing after the removal"
                assert leaving.served() == served_by_leaving, "a retired engine still took new calls"

            asyncio.run(scenario())
            failures = [outcome for outcome in outcomes if outcome != "ok"]
            assert not failures, failures[:5]
            assert joining.served() >= 3 and first.served() >= 3
        finally:
            if gateway is not None:
                gateway.stop()
            for engine in engines:
                engine.stop()
