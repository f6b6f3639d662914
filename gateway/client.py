"""A small Python client for dpgate.v1 servers (a gateway or an engine).

It wraps the generated stubs with keyword arguments for the common fields; anything more exotic
can be sent by building the request messages directly and using `inference` / `control`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc

from dpgate.v1 import control_pb2, control_pb2_grpc, generate_pb2, generate_pb2_grpc

RANK_METADATA_KEY = "x-data-parallel-rank"


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """The request fields a command-line user sets most often."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int = 0
    seed: int | None = None
    stop: Sequence[str] = ()
    ignore_eos: bool = False

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


class DpgateClient:
    def __init__(
        self,
        address: str,
        *,
        rank: str | None = None,
        api_key: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ):
        self.channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
        self.inference = generate_pb2_grpc.InferenceServiceStub(self.channel)
        self.control = control_pb2_grpc.ControlServiceStub(self.channel)
        self.metadata: list[tuple[str, str]] = []
        if rank is not None:
            self.metadata.append((RANK_METADATA_KEY, rank))
        if api_key:
            self.metadata.append(("authorization", f"Bearer {api_key}"))

    def __enter__(self) -> DpgateClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def generate(
        self, prompt: str, options: GenerationOptions = GenerationOptions(), timeout: float | None = None
    ) -> generate_pb2.GenerateResponse:
        request = generate_pb2.GenerateRequest(text=prompt, sampling=options.sampling(), stopping=options.stopping())
        return self.inference.Generate(request, metadata=self.metadata, timeout=timeout)

    def stream(
        self, prompt: str, options: GenerationOptions = GenerationOptions(), timeout: float | None = None
    ) -> Iterator[generate_pb2.GenerateStreamResponse]:
        request = generate_pb2.GenerateStreamRequest(
            text=prompt, sampling=options.sampling(), stopping=options.stopping()
        )
        return self.inference.GenerateStream(request, metadata=self.metadata, timeout=timeout)

    def server_info(self, timeout: float | None = None) -> control_pb2.GetServerInfoResponse:
        return self.control.GetServerInfo(control_pb2.GetServerInfoRequest(), metadata=self.metadata, timeout=timeout)
