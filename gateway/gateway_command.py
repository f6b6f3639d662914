"""`dpgate gateway`: run the front door in front of engines (`--engine HOST:PORT`, `--engine-dns NAME:PORT`).

Flags are read once into a `GatewayConfig` and validated as a whole; a bad flag or combination
exits 2 with one sentence naming the flag. On start the gateway prints one line
`dpgate gateway listening on HOST:PORT` to stdout (with the real port when `--port 0`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from dpgate.config_file import attribute
from dpgate.engine_token import EngineTokenError, read_engine_token
from dpgate.logs import add_log_format_argument, configure_logging
from gateway import compiled
from gateway.config import (
    TLS_KEY_PASSWORD_ENV,
    ConfigError,
    GatewayConfig,
    api_keys_from_environment,
    read_api_key_file,
    validate_config,
)
from gateway.heap import keep_mmap_threshold
from gateway.routing import POLICIES

logger = logging.getLogger("dpgate.gateway")
_DEFAULTS = GatewayConfig(engines=())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    add = parser.add_argument
    add(
        "--engine",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="an engine to forward to; repeat for each data parallel rank",
    )
    add(
        "--engine-dns",
        action="append",
        default=[],
        metavar="NAME:PORT",
        help="every A/AAAA address of NAME (a headless service) is an engine on PORT; re-resolved, repeatable",
    )
    add(
        "--engine-dns-interval",
        type=float,
        default=d.engine_dns_interval_s,
        help=f"seconds between --engine-dns lookups (default {d.engine_dns_interval_s})",
    )
    add(
        "--dns-server",
        metavar="HOST:PORT",
        help="nameserver for --engine-dns, asked directly (default: the system resolver)",
    )
    add("--host", default=d.host, help=f"address to bind (default {d.host})")
    add("--port", type=int, default=d.port, help=f"port to serve on, 0 for a free one (default {d.port})")
    add("--metrics-port", type=int, help="serve Prometheus metrics on this port (default: off)")
    add_routing_arguments(parser)
    add(
        "--api-key",
        action="append",
        default=[],
        help="accept `authorization: Bearer KEY` (repeatable; keys in $DPGATE_API_KEYS are accepted too)",
    )
    add("--api-key-file", help="file of accepted API keys, one a line")
    add_prefix_cache_sharing_argument(parser)
    add(
        "--engine-token-file",
        metavar="FILE",
        help="token to show the engines (they refuse calls without it); $DPGATE_ENGINE_TOKEN works too (default: none)",
    )
    add("--tls-cert", help="PEM certificate chain for TLS to clients")
    add("--tls-key", help="PEM private key for --tls-cert; if encrypted, its password in $DPGATE_TLS_KEY_PASSWORD")
    add("--tls-client-ca", help="PEM CA bundle; clients must show a certificate it signed (mutual TLS)")
    add("--max-message-bytes", type=int, default=d.max_message_bytes, help="largest message either way")
    add("--max-in-flight", type=int, help="refuse calls beyond this many in flight (default: no limit)")
    add(
        "--max-in-flight-per-peer",
        type=int,
        help="refuse a client address's calls beyond this many in flight (default: half of --max-in-flight, "
        "else no limit)",
    )
    add(
        "--request-body-timeout",
        type=float,
        default=d.request_body_timeout_s,
        help="seconds a call's request message may take to arrive after its headers; then DEADLINE_EXCEEDED "
        f"(default {d.request_body_timeout_s})",
    )
    add("--keepalive-time", type=float, default=d.keepalive_time_s, help="seconds between server pings")
    add("--keepalive-timeout", type=float, default=d.keepalive_timeout_s, help="seconds to await a ping ack")
    add(
        "--min-client-ping-interval",
        type=float,
        default=d.min_client_ping_interval_s,
        help="shortest accepted interval between client keepalive pings, seconds",
    )
    add_limit_arguments(parser)
    add_http_arguments(parser)
    add(
        "--drain-grace",
        type=float,
        default=d.drain_grace_s,
        help="seconds between NOT_SERVING and refusing new calls on SIGTERM",
    )
    add(
        "--shutdown-timeout",
        type=float,
        default=d.shutdown_timeout_s,
        help="seconds from SIGTERM until in-flight calls are cancelled",
    )
    add("--health-interval", type=float, default=d.health_interval_s, help="seconds between engine probes")
    add("--health-timeout", type=float, default=d.health_timeout_s, help="seconds a probe may take")
    add("--failure-threshold", type=int, default=d.failure_threshold, help="failed probes before unhealthy")
    add("--success-threshold", type=int, default=d.success_threshold, help="good probes before healthy")
    add(
        "--breaker-failure-threshold",
        type=int,
        default=d.breaker_failure_threshold,
        help="failed calls in a row that open an engine's circuit",
    )
    add(
        "--breaker-open-seconds",
        type=float,
        default=d.breaker_open_s,
        help="seconds an open circuit waits before trying the engine again",
    )
    add(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="log one line per call with its x-request-id, code and duration (default); it costs 2-6 us a call",
    )
    add_log_format_argument(parser, deprecated_json_flag=True)


def add_routing_arguments(parser: argparse.ArgumentParser) -> None:
    """`--policy` and the cache-aware policy's knobs; `dpgate serve` has them too (docs/gateway.md,
    "Cache-aware routing")."""
    d = _DEFAULTS
    add = parser.add_argument
    add(
        "--policy",
        default=d.policy,
        choices=sorted(POLICIES),
        help=f"how unpinned calls pick an engine (default {d.policy}: by the engines' prefix caches and load)",
    )
    add(
        "--cache-prefill-weight",
        type=float,
        default=d.cache_prefill_weight,
        help="cache-aware: cost of each prompt token an engine's cache lacks (default %(default)s)",
    )
    add(
        "--cache-load-weight",
        type=float,
        default=d.cache_load_weight,
        help="cache-aware: cost of each token of work an engine already has (default %(default)s)",
    )
    add(
        "--cache-balance-ratio",
        type=float,
        default=d.cache_balance_ratio,
        help="cache-aware: an engine with more calls than this times the least loaded one's, plus "
        "--cache-balance-slack, takes no cache hit: it spills to the next best (default %(default)s)",
    )
    add("--cache-balance-slack", type=int, default=d.cache_balance_slack,
        help="cache-aware: calls allowed above the ratio bound (default %(default)s)")  # fmt: skip


def routing_from_args(args: argparse.Namespace) -> dict[str, object]:
    """The GatewayConfig fields of `add_routing_arguments`."""
    return {
        "policy": args.policy,
        "cache_prefill_weight": args.cache_prefill_weight,
        "cache_load_weight": args.cache_load_weight,
        "cache_balance_ratio": args.cache_balance_ratio,
        "cache_balance_slack": args.cache_balance_slack,
    }


def add_prefix_cache_sharing_argument(parser: argparse.ArgumentParser) -> None:
    """`--prefix-cache-sharing`; `dpgate serve` has it too."""
    parser.add_argument(
        "--prefix-cache-sharing",
        choices=("isolated", "shared"),
        default="isolated",
        help="with API keys, isolated (the default) binds each call's prefix-cache salt to its key, so keys never "
        'share cached prompts; shared lets them (docs/gateway.md, "Prefix-cache tenants")',
    )


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The front door's HTTP/2 limits (shared with `dpgate serve`; docs/gateway.md, "Limits")."""
    d = _DEFAULTS
    add = parser.add_argument
    add(
        "--max-concurrent-streams",
        type=int,
        default=d.max_concurrent_streams,
        help="SETTINGS_MAX_CONCURRENT_STREAMS advertised to each client connection; streams past it are refused",
    )
    add(
        "--max-header-list-size",
        type=int,
        default=d.max_header_list_size,
        help="SETTINGS_MAX_HEADER_LIST_SIZE: largest request header list, bytes (RFC 9113 counting)",
    )
    add("--max-connections", type=int, default=d.max_connections, help="most client connections open at once")
    add(
        "--max-connections-per-peer",
        type=int,
        default=d.max_connections_per_peer,
        help="most client connections one address may have open at once",
    )
    add(
        "--header-timeout",
        type=float,
        default=d.header_timeout_s,
        help="seconds a new connection has for its preface and first request; any header block for all its frames",
    )
    add(
        "--idle-timeout",
        type=float,
        default=d.idle_timeout_s,
        help="seconds a client connection may stay without an open stream before GOAWAY",
    )
    add(
        "--hpack-table-size",
        type=int,
        default=d.hpack_table_size,
        help="SETTINGS_HEADER_TABLE_SIZE: the cap on a client's HPACK dynamic table, bytes",
    )
    add(
        "--max-continuation-frames",
        type=int,
        default=d.max_continuation_frames,
        help="most CONTINUATION frames in one header block",
    )
    add(
        "--max-resets-per-second",
        type=int,
        default=d.max_resets_per_second,
        help="rapid-reset guard: streams a client may cancel (or make the gateway reset) per second and in a burst",
    )


def add_http_arguments(parser: argparse.ArgumentParser, default_port: int | None = None) -> None:
    """The OpenAI HTTP API's port and limits (shared with `dpgate serve`; docs/http-api.md)."""
    d = _DEFAULTS
    add = parser.add_argument
    serves = "default: off" if default_port is None else f"default {default_port}; --no-http turns it off"
    add(
        "--http-port",
        type=int,
        default=default_port,
        help=f"serve the OpenAI-compatible HTTP API on this port, 0 for a free one ({serves})",
    )
    add("--http-max-body-bytes", type=int, default=d.http_max_body_bytes, help="largest HTTP request body, bytes")
    add(
        "--http-max-header-bytes",
        type=int,
        default=d.http_max_header_bytes,
        help="largest HTTP request line and header field, bytes",
    )
    add(
        "--http-max-connections",
        type=int,
        default=d.http_max_connections,
        help="most HTTP connections open at once; one more is answered 503",
    )
    add(
        "--http-idle-timeout",
        type=float,
        default=d.http_idle_timeout_s,
        help="seconds an idle keep-alive HTTP connection stays open",
    )


def http_from_args(args: argparse.Namespace) -> dict[str, int | float | None]:
    """The GatewayConfig fields `add_http_arguments` fills (`--no-http`, where the command has it, wins)."""
    return {
        "http_port": None if getattr(args, "no_http", False) else args.http_port,
        "http_max_body_bytes": args.http_max_body_bytes,
        "http_max_header_bytes": args.http_max_header_bytes,
        "http_max_connections": args.http_max_connections,
        "http_idle_timeout_s": args.http_idle_timeout,
    }


def limits_from_args(args: argparse.Namespace) -> dict[str, int | float]:
    """The GatewayConfig fields `add_limit_arguments` fills."""
    return {
        "max_concurrent_streams": args.max_concurrent_streams,
        "max_header_list_size": args.max_header_list_size,
        "max_connections": args.max_connections,
        "max_connections_per_peer": args.max_connections_per_peer,
        "header_timeout_s": args.header_timeout,
        "idle_timeout_s": args.idle_timeout,
        "hpack_table_size": args.hpack_table_size,
        "max_continuation_frames": args.max_continuation_frames,
        "max_resets_per_second": args.max_resets_per_second,
    }


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """Build and validate the config; raises ConfigError naming the flag."""
    api_keys = tuple(args.api_key)
    if args.api_key_file:
        api_keys += read_api_key_file(args.api_key_file)
    api_keys += api_keys_from_environment()
    try:
        engine_token = read_engine_token(args.engine_token_file)
    except EngineTokenError as error:
        raise ConfigError(str(error)) from None
    config = GatewayConfig(
        engine_token=engine_token,
        engines=tuple(args.engine),
        engine_dns=tuple(args.engine_dns),
        engine_dns_interval_s=args.engine_dns_interval,
        dns_server=args.dns_server,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        **routing_from_args(args),
        api_keys=api_keys,
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        tls_key_password=os.environ.get(TLS_KEY_PASSWORD_ENV),
        tls_client_ca_file=args.tls_client_ca,
        max_message_bytes=args.max_message_bytes,
        max_in_flight=args.max_in_flight,
        max_in_flight_per_peer=args.max_in_flight_per_peer,
        request_body_timeout_s=args.request_body_timeout,
        keepalive_time_s=args.keepalive_time,
        keepalive_timeout_s=args.keepalive_timeout,
        min_client_ping_interval_s=args.min_client_ping_interval,
        **limits_from_args(args),
        **http_from_args(args),  # type: ignore[arg-type]
        drain_grace_s=args.drain_grace,
        shutdown_timeout_s=args.shutdown_timeout,
        health_interval_s=args.health_interval,
        health_timeout_s=args.health_timeout,
        failure_threshold=args.failure_threshold,
        success_threshold=args.success_threshold,
        breaker_failure_threshold=args.breaker_failure_threshold,
        breaker_open_s=args.breaker_open_seconds,
        log_format=args.log_format,
        access_log=args.access_log,
        prefix_cache_sharing=args.prefix_cache_sharing,
    )
    return validate_config(config)


async def serve(config: GatewayConfig) -> None:
    """Run until SIGTERM/SIGINT, then drain."""
    from gateway.gc_settings import settle_after_start
    from gateway.server import GatewayServer

    gateway = GatewayServer(config)
    port = await gateway.start()
    settle_after_start()
    metrics = f", metrics on {config.host}:{gateway.metrics_port}" if gateway.metrics_port is not None else ""
    http = f", OpenAI HTTP API on http://{config.host}:{gateway.http_port}" if gateway.http_port is not None else ""
    print(f"dpgate gateway listening on {config.host}:{port}{metrics}{http}", flush=True)
    logger.info("forwarding to %s with policy %s", ", ".join(config.engines + config.engine_dns), config.policy)
    logger.info("data path %s", compiled.status())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await gateway.drain()
    logger.info("stopped")


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ConfigError as error:
        print(f"dpgate gateway: error: {attribute(str(error), args)}", file=sys.stderr)
        return 2
    # One access line a call: written once per loop iteration, and without the process and
    # thread fields LogRecord would look up for each line (no format of dpgate.logs shows them).
    configure_logging(config.log_format, batch_writes=True)
    logging.logProcesses = logging.logMultiprocessing = logging.logThreads = False
    keep_mmap_threshold()  # request bodies of megabytes are freed back to the system (gateway/heap.py)
    import uvloop

    try:
        uvloop.run(serve(config))
    except ConfigError as error:  # a port that cannot be bound
        print(f"dpgate gateway: error: {attribute(str(error), args)}", file=sys.stderr)
        return 2
    return 0
