"""One engine as the gateway sees it: its data-path link, a grpc.aio control channel, routing state.

Forwarded calls travel over `link` (the gateway's own HTTP/2 relay, bodies never parsed). The
grpc.aio channel carries the gateway's own low-rate calls: handshake, health, load, and the
Abort fan-out, the only forwarded call whose answers the gateway must read and merge.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpgate.v1 import control_pb2
from gateway.config import GatewayConfig
from gateway.engine_token_metadata import engine_token_interceptors
from gateway.handshake import EngineIdentity, Refusal
from gateway.health_state import CircuitBreaker, HealthState
from gateway.metadata import RANK_KEY
from gateway.reported_load import ReportedLoad
from gateway.routing import EngineView
from gateway.upstream import UpstreamLink

INFERENCE_SERVICE = "dpgate.v1.InferenceService"
CONTROL_SERVICE = "dpgate.v1.ControlService"
# The largest GetTokenizer answer accepted (a 262k-token vocabulary's JSON is about 33 MB).
_TOKENIZER_MESSAGE_BYTES = 256 * 1024 * 1024


def engine_channel_options(config: GatewayConfig) -> list[tuple[str, int]]:
    """Channel options toward engines.

    The reconnect backoff is capped near the health interval: gRPC's default grows to two
    minutes, which would keep a restarted engine out of rotation long after it is back. Retries
    are ours (once, before the first token), so gRPC's transparent retry stays off.
    """
    backoff_ms = max(100, int(config.health_interval_s * 1000))
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
        ("grpc.min_reconnect_backoff_ms", min(100, backoff_ms)),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
        ("grpc.enable_retries", 0),
        # One connection per engine channel even when two channels name the same engine.
        ("grpc.use_local_subchannel_pool", 1),
    ]


class EngineClient:
    """The gateway's handle on one engine address.

    `identity` is None until the engine passed the handshake (then it is "connected");
    `refusal` holds why the last handshake was refused. `num_in_flight` counts calls this gateway
    has open on the engine; `reported` is the engine's last GetLoad answer, aged by the calls
    this gateway has seen end since.
    """

    def __init__(self, address: str, config: GatewayConfig) -> None:
        self.address = address
        host, _, port = address.rpartition(":")
        # the data path: HTTP/2 relayed by the gateway itself
        self.link = UpstreamLink(host, int(port), config.engine_token)
        self._options = engine_channel_options(config)
        self._interceptors = engine_token_interceptors(config.engine_token)
        self._connect()
        self.identity: EngineIdentity | None = None
        self.refusal: Refusal | None = None
        self.health = HealthState(config.failure_threshold, config.success_threshold)
        self.breaker = CircuitBreaker(config.breaker_failure_threshold, config.breaker_open_s)
        self.is_serving = False
        self.num_in_flight = 0
        self.reported = ReportedLoad()  # GetLoad's figures, aged by the calls seen ending since
        # Prompt tokens its cache lacked, of calls this gateway routed there that are still open.
        self.pending_prefill_tokens = 0
        self.rank_metadata: tuple[tuple[str, str], ...] = ()
        # Set by a forwarded call that saw the engine fail, so the watcher probes at once.
        self.wake = asyncio.Event()
        self._closing: set[asyncio.Task] = set()

    def _connect(self) -> None:
        channel = aio.insecure_channel(self.address, options=self._options, interceptors=self._interceptors)
        self.channel = channel
        self.abort = channel.unary_unary(f"/{CONTROL_SERVICE}/Abort", _registered_method=True)
        self._get_server_info = channel.unary_unary(
            f"/{CONTROL_SERVICE}/GetServerInfo",
            request_serializer=control_pb2.GetServerInfoRequest.SerializeToString,
            response_deserializer=control_pb2.GetServerInfoResponse.FromString,
            _registered_method=True,
        )
        self._get_load = channel.unary_unary(
            f"/{CONTROL_SERVICE}/GetLoad",
            request_serializer=control_pb2.GetLoadRequest.SerializeToString,
            response_deserializer=control_pb2.GetLoadResponse.FromString,
            _registered_method=True,
        )
        self._watch_kv_events = channel.unary_stream(
            f"/{CONTROL_SERVICE}/WatchKvEvents",
            request_serializer=control_pb2.WatchKvEventsRequest.SerializeToString,
            response_deserializer=control_pb2.WatchKvEventsResponse.FromString,
            _registered_method=True,
        )
        self._health = health_pb2_grpc.HealthStub(channel)

    def reconnect(self) -> None:
        """Replace the channel with a fresh one that connects at once.

        Used while the engine is unreachable: a channel in TRANSIENT_FAILURE waits out its
        reconnect backoff, but a restarted engine should be seen at the very next probe. The
        old channel can carry no live call (its connection is gone), so closing it loses nothing.
        """
        old = self.channel
        self._connect()
        self._closing.add(asyncio.get_running_loop().create_task(old.close(grace=None)))
        for task in list(self._closing):
            if task.done():
                self._closing.discard(task)

    @property
    def rank(self) -> int | None:
        return self.identity.rank if self.identity is not None else None

    def accept(self, identity: EngineIdentity) -> None:
        self.identity = identity
        self.refusal = None
        self.rank_metadata = ((RANK_KEY, str(identity.rank)),)

    def view(self, now: float) -> EngineView:
        """A routing snapshot; only valid for a connected engine. (Positional: routing makes one of
        every engine for every call, and ten keywords made each view 0.4 us dearer: issue 27.)"""
        identity = self.identity
        assert identity is not None  # the pool only views connected engines
        num_running, num_waiting, kv_tokens = self.reported.figures(identity.kv_block_size)
        return EngineView(
            self.address,  # address
            identity.rank,  # rank
            identity.model,  # model
            self.health.is_healthy,  # is_healthy
            not self.is_serving,  # is_draining
            self.breaker.allows_calls(now),  # is_circuit_closed
            self.num_in_flight,  # num_in_flight
            num_running,  # num_running
            num_waiting,  # num_waiting
            kv_tokens + self.pending_prefill_tokens,  # load_tokens
        )

    async def fetch_identity(self, timeout: float) -> EngineIdentity:
        info = await self._get_server_info(control_pb2.GetServerInfoRequest(), timeout=timeout)
        parallelism = info.parallelism
        return EngineIdentity(
            address=self.address,
            rank=parallelism.data_parallel_rank,
            data_parallel_size=parallelism.data_parallel_size,
            model=info.model,
            version=info.version,
            tensor_parallel_size=parallelism.tensor_parallel_size,
            decode_context_parallel_size=parallelism.decode_context_parallel_size,
            max_model_len=info.max_model_len,
            kv_block_size=info.kv_block_size,
            num_kv_blocks=info.num_kv_blocks,
            prefix_caching=info.prefix_caching,
            prefix_cache_root_hash=info.prefix_cache_root_hash,
            tokenizer_fingerprint=info.tokenizer_fingerprint,
        )

    async def fetch_tokenizer(self, timeout: float) -> control_pb2.GetTokenizerResponse:
        """The engine's tokenizer JSON and chat template, once per fingerprint.

        A channel of its own: a large vocabulary's JSON (Gemma 3's is tens of MB) passes the
        control channel's message limit, which stays as configured for everything else.
        """
        options = [*self._options, ("grpc.max_receive_message_length", _TOKENIZER_MESSAGE_BYTES)]
        async with aio.insecure_channel(self.address, options=options) as channel:
            get_tokenizer = channel.unary_unary(
                f"/{CONTROL_SERVICE}/GetTokenizer",
                request_serializer=control_pb2.GetTokenizerRequest.SerializeToString,
                response_deserializer=control_pb2.GetTokenizerResponse.FromString,
                _registered_method=True,
            )
            return await get_tokenizer(control_pb2.GetTokenizerRequest(), timeout=timeout)

    def watch_kv_events(self) -> grpc.aio.UnaryStreamCall:
        """The engine's prefix-cache event stream, on the current channel (gateway/kv_watch.py reads it)."""
        return self._watch_kv_events(control_pb2.WatchKvEventsRequest())

    async def check_serving(self, timeout: float) -> bool:
        """True when the engine's inference service reports SERVING; raises AioRpcError if unreachable."""
        request = health_pb2.HealthCheckRequest(service=INFERENCE_SERVICE)
        response = await self._health.Check(request, timeout=timeout)
        return response.status == health_pb2.HealthCheckResponse.SERVING

    async def refresh_load(self, timeout: float) -> None:
        ask, released_before = self.reported.asking()
        load = await self._get_load(control_pb2.GetLoadRequest(), timeout=timeout)
        self.reported.answered(ask, released_before, load)

    async def close(self) -> None:
        self.link.close()
        await self.channel.close(grace=None)
        await asyncio.gather(*self._closing, return_exceptions=True)


def is_unreachable(error: grpc.aio.AioRpcError) -> bool:
    """Whether an engine call failed because the engine could not be reached at all."""
    return error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
