"""The forwarder: the front door's checks, then one call object per admitted call.

Every client stream reaches `Forwarder.open_call`. The checks run in the order DESIGN.md gives
them, before any engine is contacted: API key (health exempt), admission (draining, in-flight
limit), then `x-data-parallel-rank`. Every dpgate.v1 call gets its `x-request-id` first (the
client's, or a new one: dpgate/request_id.py), so even a refused call echoes it and is logged
with it (one access line a call, logger `dpgate.gateway.access`). A dpgate.v1 call that passes becomes a `ForwardedCall`
(gateway/forwarded_call.py); anything else (health, reflection) becomes a `PassThroughCall`
(gateway/pass_through.py), relayed untouched to the gateway's own local services. The
`Forwarder` also holds what the calls share: choosing an engine, metrics, outcome bookkeeping.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Final

import grpc

from dpgate.logs import lone_batched_handler
from dpgate.request_id import new_request_id, resolve_request_id
from gateway.call_headers import CallHeaders, request_id_field
from gateway.config import GatewayConfig
from gateway.engine_client import CONTROL_SERVICE, INFERENCE_SERVICE, EngineClient
from gateway.engine_pool import EnginePool
from gateway.errors import InvalidArgument
from gateway.forwarded_call import ForwardedCall, OpenedCall
from gateway.front_door import ServerCall
from gateway.grpc_wire import status_trailers
from gateway.health_state import Blame, CallEvent
from gateway.loop_metrics import CounterValue, HistogramValue
from gateway.metadata import RANK_KEY, parse_data_parallel_rank
from gateway.metrics import GatewayMetrics
from gateway.pass_through import PassThroughCall
from gateway.prompt_routing import PromptRouter
from gateway.routing import RouteRequest, RoutingPolicy, choose_engine_for_request
from gateway.routing.filters import PromptBlocks
from gateway.tenant import tenant_fields, tenant_names
from gateway.upstream import UpstreamLink

DRAINING_MESSAGE: Final = "gateway is shutting down; retry on another gateway"
UNAUTHENTICATED_MESSAGE: Final = "missing or invalid API key: send metadata `authorization: Bearer KEY`"

# With API keys, only Check is open to callers without one (probes): a Watch stream is held open,
# and 4,000 unauthenticated ones took the gateway from 49 to 104 MB (issue 22).
HEALTH_CHECK: Final = b"/grpc.health.v1.Health/Check"
# path -> (rpc name, response streaming)
DPGATE_METHODS: Final[dict[bytes, tuple[str, bool]]] = {
    f"/{INFERENCE_SERVICE}/Generate".encode(): ("Generate", False),
    f"/{INFERENCE_SERVICE}/GenerateStream".encode(): ("GenerateStream", True),
    f"/{INFERENCE_SERVICE}/Chat".encode(): ("Chat", False),
    f"/{INFERENCE_SERVICE}/ChatStream".encode(): ("ChatStream", True),
    **{
        f"/{CONTROL_SERVICE}/{name}".encode(): (name, False)
        for name in ("GetServerInfo", "GetModelInfo", "GetLoad", "Abort", "ResetPrefixCache")
    },
}
_DPGATE_PREFIX: Final = b"/dpgate.v1."
logger = logging.getLogger("dpgate.gateway.forwarding")
access_logger = logging.getLogger("dpgate.gateway.access")


class Forwarder:
    """Admits each client call and forwards it (see the module docstring)."""

    def __init__(self, pool: EnginePool, policy: RoutingPolicy, metrics: GatewayMetrics, config: GatewayConfig) -> None:
        self._pool = pool
        self._policy = policy
        self.metrics = metrics
        self.config = config
        self.max_message_bytes = config.max_message_bytes
        self._accepted_keys = tuple(f"Bearer {key}".encode() for key in config.api_keys)
        self._tenant_fields = tenant_fields(config.api_keys, config.prefix_cache_sharing)
        self.prompts = PromptRouter(pool, tenant_names(config.api_keys, config.prefix_cache_sharing))
        self.local_services: UpstreamLink | None = None  # set by the server once they listen
        self.is_refusing = False
        self.num_in_flight = 0
        # The in-flight gauge reads the count when scraped, instead of moving twice a call (issue 27).
        metrics.in_flight.set_function(lambda: self.num_in_flight)
        self.in_flight_by_peer: dict[str, int] = {}  # client address -> its calls in flight
        self._peer_limit = config.peer_in_flight_limit
        self.calls: set[ForwardedCall] = set()
        self._rejected_metadata = metrics.rejected_metadata.labels(key=RANK_KEY)
        for rpc, _ in DPGATE_METHODS.values():  # at 0 from the start (see gateway/metrics.py)
            metrics.retries.labels(rpc=rpc)
        self._routed: dict[int, CounterValue] = {}
        self._requests: dict[tuple[str, str], CounterValue] = {}  # by rpc and code name
        self._durations: dict[str, HistogramValue] = {}
        self._added: dict[str, HistogramValue] = {}  # dpgate_gateway_added_latency_seconds, by rpc
        # Calls ended in this loop iteration, accounted for at its end (see call_ended).
        # (rpc, code, rank, start, end, request id, added_from)
        self._ended: list[tuple[str, grpc.StatusCode, int | None, float, float, str, float | None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop calls end on, once seen
        if config.max_in_flight is not None:
            self._full_message = f"gateway is at its limit of {config.max_in_flight} calls in flight"

    # --- admission ----------------------------------------------------------------------------

    def open_call(self, call: OpenedCall, end_stream: bool) -> None:
        headers = CallHeaders(call.headers)
        path = headers.path
        if not path.startswith(_DPGATE_PREFIX):  # health, reflection: the gateway's own services
            if self._accepted_keys and path != HEALTH_CHECK and not self._is_authorized(headers):
                call.refuse(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
            elif not isinstance(call, ServerCall):  # the HTTP API asks for dpgate.v1 methods only
                call.refuse(grpc.StatusCode.UNIMPLEMENTED, f"{path.decode(errors='replace')} is not a dpgate.v1 method")
            else:
                PassThroughCall(self, call, headers, end_stream)
            return
        request_id = self._request_id(headers)
        if self._accepted_keys and not self._is_authorized(headers):
            self._refuse(call, path, request_id, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
            return
        method = DPGATE_METHODS.get(path)
        if method is None:
            message = f"method {path.decode(errors='replace')} is not served by this gateway"
            self._refuse(call, path, request_id, grpc.StatusCode.UNIMPLEMENTED, message)
            return
        rpc, streaming = method
        if self.is_refusing:
            self._refuse(call, path, request_id, grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
            return
        if self.config.max_in_flight is not None and self.num_in_flight >= self.config.max_in_flight:
            self._refuse(call, path, request_id, grpc.StatusCode.RESOURCE_EXHAUSTED, self._full_message)
            return
        peer = call.peer
        if self._peer_limit is not None and self.in_flight_by_peer.get(peer, 0) >= self._peer_limit:
            message = f"this client is at its limit of {self._peer_limit} calls in flight (--max-in-flight-per-peer)"
            self._refuse(call, path, request_id, grpc.StatusCode.RESOURCE_EXHAUSTED, message)
            return
        try:
            rank = parse_data_parallel_rank(headers.rank_fields)
        except InvalidArgument as error:
            self._rejected_metadata.inc()
            self._refuse(call, path, request_id, grpc.StatusCode.INVALID_ARGUMENT, error.message)
            return
        if self._tenant_fields:
            headers.tenant_field = self._tenant_fields[headers.authorization[0]]
        ForwardedCall(self, call, headers, rpc, streaming, rank, end_stream, request_id)

    @staticmethod
    def _request_id(headers: CallHeaders) -> str:
        if not headers.request_ids:  # (most calls: a new id, with nothing to check or say)
            return new_request_id()
        request_id, problem = resolve_request_id(headers.request_ids)
        if problem is not None:  # a broken id is worth a line
            logger.warning(
                "the call's x-request-id %s; it is replaced by %s",
                problem,
                request_id,
                extra={"request_id": request_id},
            )
        return request_id

    def _is_authorized(self, headers: CallHeaders) -> bool:
        return self.accepts_authorization(headers.authorization)

    @property
    def requires_api_key(self) -> bool:
        return bool(self._accepted_keys)

    def accepts_authorization(self, values: list[bytes]) -> bool:
        """Whether one `authorization` value was sent and it is `Bearer KEY` for an accepted key."""
        if len(values) != 1:
            return False
        offered = values[0]
        # Compare against every key (no early exit) so timing does not reveal which key matched.
        matches = [hmac.compare_digest(offered, accepted) for accepted in self._accepted_keys]
        return any(matches)

    def _refuse(self, call: OpenedCall, path: bytes, request_id: str, code: grpc.StatusCode, message: str) -> None:
        """End a dpgate.v1 call at the front door (trailers-only, with its id), counted and logged like any call."""
        call.finish(status_trailers(code, message, request_id_field(request_id)))
        method = DPGATE_METHODS.get(path)
        rpc = method[0] if method is not None else path.decode(errors="replace")
        start = time.perf_counter()
        if method is not None:
            self.record(rpc, code, start)
        self.log_call(rpc, code, None, start, request_id)

    # --- shared by the calls ------------------------------------------------------------------

    def choose(
        self, rank: int | None, excluded: frozenset[str], model: str | None = None, prompt: PromptBlocks | None = None
    ) -> EngineClient:
        """`model`: when the caller read it from the request (the gRPC relay does not parse bodies);
        `prompt`: the request's block hashes, when the gateway hashed its prompt (cache-aware routing)."""
        request = RouteRequest(rank=rank, model=model, excluded_addresses=excluded, prompt=prompt)
        pool = self._pool
        view = choose_engine_for_request(
            pool.snapshot(), request, self._policy, data_parallel_size=pool.data_parallel_size
        )
        if rank is None:
            reason = getattr(self._policy, "last_reason", None)  # only cache-aware tells why
            cached = prompt.cached_tokens.get(view.address, 0) if prompt is not None else 0
            num_tokens = prompt.num_prompt_tokens if prompt is not None else 0
            self.metrics.record_route(reason._value_ if reason is not None else "load", view.rank, num_tokens, cached)
        return pool.by_address[view.address]

    def call_ended(
        self,
        rpc: str,
        code: grpc.StatusCode,
        rank: int | None,
        start: float,
        request_id: str,
        added_from: float | None = None,
    ) -> None:
        """Count, time and log a relayed call that just ended, once this loop iteration's writes are out.

        The call's last bytes were only queued (the connection writes once per iteration, a
        callback scheduled before this one), so the bookkeeping (the counter and histogram, the
        access line: a fifth of a unary call's CPU) waits for a callback of its own instead of
        delaying the answer (issue 27). The end time is taken now. `added_from`: see CallHost.
        """
        if not self._ended:
            loop = self._loop
            if loop is None or not loop.is_running():  # (get_running_loop makes a system call)
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._account_ended)
        self._ended.append((rpc, code, rank, start, time.perf_counter(), request_id, added_from))

    def _account_ended(self) -> None:
        ended, self._ended = self._ended, []
        for rpc, code, rank, start, end, request_id, added_from in ended:
            self.record(rpc, code, start, end)
            if added_from is not None:
                added = self._added.get(rpc)
                if added is None:
                    added = self._added[rpc] = self.metrics.added_latency.labels(rpc=rpc)
                added.observe(max(0.0, end - added_from))
            self.log_call(rpc, code, rank, start, request_id, end)

    def record(self, rpc: str, code: grpc.StatusCode, start: float, end: float | None = None) -> None:
        # (`_name_`: Enum's plain attribute for the name; `name` is a property and an Enum member's
        # hash is Enum.__hash__, Python calls a unary call made several of: issue 27.)
        key = (rpc, code._name_)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self.metrics.requests.labels(rpc=rpc, code=code._name_)
        counter.inc()
        duration = self._durations.get(rpc)
        if duration is None:
            duration = self._durations[rpc] = self.metrics.duration.labels(rpc=rpc)
        duration.observe((time.perf_counter() if end is None else end) - start)

    def log_call(
        self, rpc: str, code: grpc.StatusCode, rank: int | None, start: float, request_id: str, end: float | None = None
    ) -> None:
        """The call's access line: rpc, final code, serving rank, duration and its x-request-id.

        One line per call is the gateway's most frequent work after relaying (issue 27): where
        the line goes to the gateway's batched stderr handler alone (the usual case), its text is
        written straight there, without a LogRecord (dpgate.logs.lone_batched_handler); anywhere
        else the record is made and handed to the handlers directly (what `Logger.info` does,
        without walking the stack for the caller's file and line, which no format shows)."""
        if not self.config.access_log or not access_logger.isEnabledFor(logging.INFO):
            return
        duration_ms = round(((time.perf_counter() if end is None else end) - start) * 1000, 3)
        code_name = code._name_  # (see record)
        fields: dict[str, object] = {"request_id": request_id, "rpc": rpc, "code": code_name}
        fields["duration_ms"] = duration_ms
        if rank is not None:
            fields["data_parallel_rank"] = rank
        served = "" if rank is None else f" by rank {rank}"
        handler = lone_batched_handler(access_logger, logging.INFO)
        if handler is not None:
            message = f"{rpc} {code_name}{served} in {duration_ms:.1f} ms"
            handler.emit_fields(time.time(), "INFO", access_logger.name, message, fields)
            return
        record = access_logger.makeRecord(
            access_logger.name, logging.INFO, __file__, 0, "%s %s%s in %.1f ms",
            (rpc, code_name, served, duration_ms), None, "log_call", fields,
        )  # fmt: skip
        access_logger.handle(record)

    def record_outcome(self, engine: EngineClient, outcome: str | CallEvent) -> None:
        """How one attempt on `engine` ended: a status code name, or a CallEvent (see health_state)."""
        if self._pool.record_outcome(engine, outcome) is not Blame.NONE:
            return
        rank = engine.rank or 0
        counter = self._routed.get(rank)
        if counter is None:
            counter = self._routed[rank] = self.metrics.routed.labels(rank=str(rank))
        counter.inc()

    def usable_engines(self) -> list[EngineClient]:
        """Engines an unpinned Abort goes to: the healthy connected ones, and retiring ones still finishing calls."""
        pool = self._pool
        return [engine for engine in pool.connected() if engine.health.is_healthy] + list(pool.retiring)

    def cancel_all(self) -> None:
        """End every call in flight (shutdown timeout): upstream streams are reset."""
        for call in list(self.calls):
            call.cancel(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
