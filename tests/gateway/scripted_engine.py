"""A dpgate.v1 engine for tests, run in the test's own process, whose answers a prompt scripts.

It serves what a gateway needs to accept it (GetServerInfo, GetLoad, grpc.health.v1) and answers
Generate and GenerateStream by the request's `text`:
- `trailers`: OK, with custom initial and trailing metadata.
- `details`: FAILED_PRECONDITION with a `google.rpc.Status` in grpc-status-details-bin and
  custom trailing metadata.
- `slow`: a stream of a prompt info then one delta every 50 ms, up to `max_tokens`; the engine
  records whether the call was cancelled (`cancelled`, `num_running`).
- `gzip`: the stream of `slow` without delay, its messages gzip-compressed (their text is long
  and repetitive: gRPC sends a message uncompressed when compressing would not shrink it).
- `bulk`: the stream of `slow` without delay, each delta carrying `BULK_TEXT_BYTES` of text, so
  a long one outlasts many of the flow-control windows the gateway opens upstream.
It runs on its own event loop in a daemon thread; `ScriptedEngine.start()` returns once it serves
on 127.0.0.1 (port 0), and `stop()` ends it.
"""

from __future__ import annotations

import asyncio
import threading

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from dpgate.v1 import control_pb2, generate_pb2

INFERENCE_SERVICE = "dpgate.v1.InferenceService"
CONTROL_SERVICE = "dpgate.v1.ControlService"
TRAILING = (("x-engine-note", "kept"), ("x-engine-trace-bin", b"\x00\x01\x02"))
INITIAL = (("x-engine-initial", "hello"),)
DETAILS_MESSAGE = "the engine says no"
# A serialized google.rpc.Status {code: 9 (FAILED_PRECONDITION), message: DETAILS_MESSAGE}, by hand
# (googleapis-common-protos is not a dependency): field 1 varint, field 2 length-delimited.
DETAILS = b"\x08\x09\x12" + bytes([len(DETAILS_MESSAGE)]) + DETAILS_MESSAGE.encode()
TOKEN_DELAY_S = 0.05
BULK_TEXT_BYTES = 16_000


class ScriptedEngine:
    def __init__(self) -> None:
        self.port = 0
        self.num_running = 0
        self.cancelled: list[str] = []  # rpc names of calls whose client (the gateway) cancelled them
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: aio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scripted-engine", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ScriptedEngine:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the scripted engine did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(None), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self) -> None:
        server = aio.server()
        unary = grpc.unary_unary_rpc_method_handler
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    INFERENCE_SERVICE,
                    {
                        "Generate": unary(self._generate),
                        "GenerateStream": grpc.unary_stream_rpc_method_handler(self._generate_stream),
                    },
                ),
                grpc.method_handlers_generic_handler(
                    CONTROL_SERVICE, {"GetServerInfo": unary(self._server_info), "GetLoad": unary(self._load)}
                ),
            )
        )
        health = health_aio.HealthServicer()
        for service in ("", INFERENCE_SERVICE, CONTROL_SERVICE):
            await health.set(service, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server

    async def _server_info(self, raw: bytes, context: aio.ServicerContext) -> bytes:
        parallelism = control_pb2.Parallelism(
            data_parallel_rank=0, data_parallel_size=1, tensor_parallel_size=1, decode_context_parallel_size=1
        )
        info = control_pb2.GetServerInfoResponse(version="scripted", parallelism=parallelism, model="scripted")
        return info.SerializeToString()

    async def _load(self, raw: bytes, context: aio.ServicerContext) -> bytes:
        return control_pb2.GetLoadResponse(num_running=self.num_running).SerializeToString()

    async def _generate(self, raw: bytes, context: aio.ServicerContext) -> bytes:
        request = generate_pb2.GenerateRequest.FromString(raw)
        if request.text == "trailers":
            await context.send_initial_metadata(INITIAL)
            context.set_trailing_metadata(TRAILING)
            return generate_pb2.GenerateResponse(text="with trailers").SerializeToString()
        if request.text == "details":
            context.set_trailing_metadata((*TRAILING, ("grpc-status-details-bin", DETAILS)))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, DETAILS_MESSAGE)
        return generate_pb2.GenerateResponse(text="plain").SerializeToString()

    async def _generate_stream(self, raw: bytes, context: aio.ServicerContext) -> None:
        request = generate_pb2.GenerateStreamRequest.FromString(raw)
        delay = TOKEN_DELAY_S if request.text == "slow" else 0.0
        filler = 1
        if request.text == "gzip":
            context.set_compression(grpc.Compression.Gzip)
            filler = 4000
        elif request.text == "bulk":
            filler = BULK_TEXT_BYTES
        self.num_running += 1
        try:
            info = generate_pb2.PromptInfo(request_id="s" * filler)
            await context.write(generate_pb2.GenerateStreamResponse(prompt_info=info).SerializeToString())
            delta = generate_pb2.GenerateStreamResponse(delta=generate_pb2.Delta(text="x" * filler, token_ids=[7]))
            for _ in range(request.stopping.max_tokens or 1):
                if delay:
                    await asyncio.sleep(delay)
                await context.write(delta.SerializeToString())
            finish = generate_pb2.GenerateStreamResponse(finish=generate_pb2.FinishInfo(num_generated_tokens=1))
            await context.write(finish.SerializeToString())
        except asyncio.CancelledError:
            self.cancelled.append("GenerateStream")
            raise
        finally:
            self.num_running -= 1
