"""Real servers for the client's tests: two synthetic engines (ranks 0 and 1 of 2) behind gateways.

One gateway each for plain calls, API keys, TLS and mutual TLS, all on free 127.0.0.1 ports, so
the client is tested over real sockets against the real front door. The engines answer in
milliseconds; TOKEN_DELAY_S per streamed token makes a long stream slow enough to hit a deadline.
Chat needs a model with a chat template, so its tests share one real SmolLM2 engine and gateway.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpgate.client import DpgateClient, DpgateError, TlsOptions
from engines.model.source import DEFAULT_MODEL
from tests.gateway.tls_files import CertPair, make_ca, make_signed
from tests.support.gateway_processes import (
    FAST_HEALTH,
    EngineProcess,
    GatewayProcess,
    SyntheticEngineProcess,
    all_serving,
)

TOKEN_DELAY_S = 0.01
API_KEY = "client-test-key"
# The mutual-TLS gateway's certificate carries only this name, not the address dialled.
SERVER_NAME = "gateway.dpgate.test"


@pytest.fixture(scope="session")
def synthetic_pair(log_dir: Path) -> Iterator[list[SyntheticEngineProcess]]:
    pair = [SyntheticEngineProcess(rank, 2, log_dir, "--token-delay", str(TOKEN_DELAY_S)) for rank in (0, 1)]
    with all_serving(pair):
        yield pair


def _gateway(engines: list[SyntheticEngineProcess], log_dir: Path, name: str, *flags: str) -> GatewayProcess:
    return GatewayProcess([e.address for e in engines], *FAST_HEALTH, *flags, log_dir=log_dir, name=name)


def wait_until_answering(client: DpgateClient, timeout: float = 15) -> None:
    """Until a GetServerInfo succeeds: the gateway binds before its engines' handshake completes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.server_info(timeout=2, rank=0)
            client.server_info(timeout=2, rank=1)
            return
        except DpgateError as error:
            if error.code.name != "UNAVAILABLE" or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(scope="session")
def plain_gateway(synthetic_pair, log_dir) -> Iterator[GatewayProcess]:
    gateway = _gateway(synthetic_pair, log_dir, "gateway-client-plain")
    try:
        gateway.wait_ranks([0, 1])
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="session")
def key_gateway(synthetic_pair, log_dir) -> Iterator[GatewayProcess]:
    gateway = _gateway(synthetic_pair, log_dir, "gateway-client-key", "--api-key", API_KEY)
    try:
        with DpgateClient(gateway.address, api_key=API_KEY) as client:
            wait_until_answering(client)
        yield gateway
    finally:
        gateway.stop()


@dataclass(frozen=True, slots=True)
class Pki:
    ca: CertPair
    server: CertPair
    renamed_server: CertPair
    client: CertPair


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the TLS tests make certificates with the openssl command line, which is not installed")
    directory = tmp_path_factory.mktemp("client-pki")
    ca = make_ca(directory, "ca")
    return Pki(
        ca=ca,
        server=make_signed(directory, "server", ca, "serverAuth"),
        renamed_server=make_signed(directory, "renamed", ca, "serverAuth", alt_names=f"DNS:{SERVER_NAME}"),
        client=make_signed(directory, "client", ca, "clientAuth"),
    )


@pytest.fixture(scope="session")
def tls_gateway(synthetic_pair, log_dir, pki) -> Iterator[GatewayProcess]:
    """TLS with a certificate for localhost and 127.0.0.1; no client certificate asked."""
    flags = ("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key))
    gateway = _gateway(synthetic_pair, log_dir, "gateway-client-tls", *flags)
    try:
        with DpgateClient(gateway.address, tls=TlsOptions.from_files(ca=pki.ca.cert)) as client:
            wait_until_answering(client)
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="session")
def mtls_gateway(synthetic_pair, log_dir, pki) -> Iterator[GatewayProcess]:
    """Mutual TLS, and a server certificate for SERVER_NAME only (so a client must override the name)."""
    flags = (
        "--tls-cert", str(pki.renamed_server.cert), "--tls-key", str(pki.renamed_server.key),
        "--tls-client-ca", str(pki.ca.cert),
    )  # fmt: skip
    gateway = _gateway(synthetic_pair, log_dir, "gateway-client-mtls", *flags)
    tls = TlsOptions.from_files(ca=pki.ca.cert, cert=pki.client.cert, key=pki.client.key, server_name=SERVER_NAME)
    try:
        with DpgateClient(gateway.address, tls=tls) as client:
            wait_until_answering(client)
        yield gateway
    finally:
        gateway.stop()


@dataclass(frozen=True, slots=True)
class ChatServer:
    """The real SmolLM2 engine (rank 0 of 1) and a gateway in front of it, for the chat tests."""

    engine: EngineProcess
    gateway: GatewayProcess


@pytest.fixture(scope="session")
def smollm2_chat_server(log_dir: Path) -> Iterator[ChatServer]:
    """One SmolLM2 engine and gateway shared by the chat client and `dpgate chat` tests (a real model
    loads in seconds, but not per test). The engine logs to its own file: its request log lines are
    how a test sees that a cancelled answer was aborted."""
    engine = EngineProcess(Path(DEFAULT_MODEL), 0, 1, log_dir)
    engine.log_path = log_dir / "chat-smollm2-engine.log"
    engine.start()
    try:
        engine.wait_serving(timeout=120)
        gateway = GatewayProcess([engine.address], *FAST_HEALTH, log_dir=log_dir, name="gateway-chat")
        try:
            gateway.wait_ranks([0])
            yield ChatServer(engine, gateway)
        finally:
            gateway.stop()
    finally:
        engine.stop()
