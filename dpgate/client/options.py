"""What a dpgate client sends: generation options, call metadata and channel security.

Kept apart from the clients so the blocking and the asyncio client build exactly the same requests,
metadata and credentials. Everything here is checked where it enters, with a ValueError that names
the argument and the rule, because a bad rank or key found by the server costs a round trip and
reads worse (grpc itself refuses a non-ASCII metadata value with a message about the C core).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from dpgate.v1 import generate_pb2

RANK_METADATA_KEY = "x-data-parallel-rank"
MAX_RANK = 2**32 - 1
# The gateway compares `authorization` with `Bearer KEY` byte for byte (gateway/forwarding.py).
AUTHORIZATION_KEY = "authorization"


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """The request fields a command-line user sets most often; None leaves a field to the server."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int = 0
    seed: int | None = None
    stop: Sequence[str] = ()
    ignore_eos: bool = False
    cache_salt: str = ""  # requests with different salts never share the engine's cached prompt blocks

    def sampling(self) -> generate_pb2.SamplingParams:
        params = generate_pb2.SamplingParams(top_k=self.top_k)
        if self.temperature is not None:
            params.temperature = self.temperature
        if self.top_p is not None:
            params.top_p = self.top_p
        if self.seed is not None:
            params.seed = self.seed
        return params

    def stopping(self) -> generate_pb2.StoppingCriteria:
        stopping = generate_pb2.StoppingCriteria(stop=list(self.stop), ignore_eos=self.ignore_eos)
        if self.max_tokens is not None:
            stopping.max_tokens = self.max_tokens
        return stopping

    def generate_request(self, prompt: str) -> generate_pb2.GenerateRequest:
        return generate_pb2.GenerateRequest(
            text=prompt, sampling=self.sampling(), stopping=self.stopping(), cache_salt=self.cache_salt
        )

    def stream_request(self, prompt: str) -> generate_pb2.GenerateStreamRequest:
        return generate_pb2.GenerateStreamRequest(
            text=prompt, sampling=self.sampling(), stopping=self.stopping(), cache_salt=self.cache_salt
        )


# Every field left to the server; one shared instance serves as the calls' default (it is frozen).
DEFAULT_OPTIONS = GenerationOptions()


def check_rank(rank: int | None) -> int | None:
    """`rank` itself when it is None or an unsigned 32-bit integer (the gateway's rule 1)."""
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK:
        raise ValueError(f"rank must be an integer in 0..{MAX_RANK}, got {rank!r}")
    return rank


def check_api_key(api_key: str | None) -> str | None:
    """`api_key` itself when it is None or what the gateway accepts: printable ASCII, no spaces."""
    if api_key is None:
        return None
    if not api_key or not api_key.isascii() or not api_key.isprintable() or " " in api_key:
        raise ValueError("api_key must be non-empty printable ASCII without spaces")
    return api_key


def check_timeout(timeout: float | None) -> float | None:
    """`timeout` itself when it is None or a finite number of seconds above zero."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
        raise ValueError(f"timeout must be a finite number of seconds, got {timeout!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be above 0 seconds, got {timeout!r}")
    return float(timeout)


def call_metadata(rank: int | None, api_key: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata of one call: the rank pin and the API key, each only when given."""
    metadata: list[tuple[str, str]] = []
    if rank is not None:
        metadata.append((RANK_METADATA_KEY, str(rank)))
    if api_key is not None:
        metadata.append((AUTHORIZATION_KEY, f"Bearer {api_key}"))
    return tuple(metadata)


def serving_rank(trailing_metadata: Sequence[tuple[str, str | bytes]] | None) -> int | None:
    """The rank that served a call, from the gateway's trailing metadata; None from an engine directly."""
    for key, value in trailing_metadata or ():
        if key == RANK_METADATA_KEY:
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
            return int(text) if text.isdigit() else None
    return None


def _read(path: str | Path, argument: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"{argument} {str(path)!r} is not a readable file ({error.strerror})") from None


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """TLS to the server: PEM bytes, None for each part not used.

    `root_certificates` None trusts the system's roots. `certificate_chain` and `private_key` (together)
    are the client's certificate for mutual TLS. `server_name` overrides the name the server's
    certificate must carry, for a certificate issued to a name other than the address dialled.
    Build it from files with `TlsOptions.from_files(ca="ca.pem")`.
    """

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError("a client certificate and its private key must be given together")
        if self.server_name is not None and (not self.server_name or not self.server_name.isascii()):
            raise ValueError(f"server_name must be a non-empty ASCII host name, got {self.server_name!r}")

    @classmethod
    def from_files(
        cls,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        server_name: str | None = None,
    ) -> TlsOptions:
        """Read the PEM files; a file that cannot be read raises ValueError naming it."""
        return cls(
            root_certificates=None if ca is None else _read(ca, "ca"),
            certificate_chain=None if cert is None else _read(cert, "cert"),
            private_key=None if key is None else _read(key, "key"),
            server_name=server_name,
        )

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    def channel_options(self) -> tuple[tuple[str, str], ...]:
        if self.server_name is None:
            return ()
        return (("grpc.ssl_target_name_override", self.server_name),)
