"""`dpgate serve`: a gateway on --port plus --data-parallel-size engines on free local ports.

Engines run as subprocesses (`python -m dpgate.cli engine ...`) so this process never imports
torch: it is a gateway host that happens to start its own engines. Each engine gets its global
rank and the DP size on its command line and reports them back in the handshake; the gateway
learns the topology from them like any other. Its health reports SERVING only once all N
engines passed the handshake and serve (`GatewayConfig.ready_data_parallel_size`), so a client
that waits for SERVING may pin any rank at once. SIGTERM drains the gateway first, then stops
the engines. Each run makes a new engine token (dpgate/engine_token.py), handed to the engines
through their environment and to the gateway in its config: the engines' ports serve only it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys

from dpgate.config_file import attribute
from dpgate.engine_token import ENGINE_TOKEN_ENV, new_engine_token
from dpgate.host import usable_cores
from dpgate.logs import add_log_format_argument, configure_logging
from dpgate.ports import free_port
from gateway.config import ConfigError, GatewayConfig, api_keys_from_environment, validate_config
from gateway.gateway_command import (
    add_http_arguments,
    add_limit_arguments,
    add_prefix_cache_sharing_argument,
    add_routing_arguments,
    http_from_args,
    limits_from_args,
    routing_from_args,
)

logger = logging.getLogger("dpgate.serve")
DEFAULT_HTTP_PORT = 8000
ENGINE_STOP_TIMEOUT_S = 15.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--data-parallel-size", type=int, default=1, help="number of engines (DP ranks) to start (default 1)")
    add("--host", default="127.0.0.1", help="address the gateway binds (default 127.0.0.1)")
    add("--port", type=int, default=50051, help="gateway port (default 50051)")
    add("--metrics-port", type=int, help="gateway Prometheus port (default: off)")
    add(
        "--engine-metrics-port",
        type=int,
        metavar="BASE",
        help="engine rank R serves Prometheus metrics on port BASE + R (default: off)",
    )
    add("--model", help="model for every engine (default: the engine's default, SmolLM2-135M-Instruct)")
    add("--dtype", help="engine compute dtype (default: the engine's)")
    add("--max-model-len", type=int, help="engine context length (default: the model's)")
    add("--tensor-parallel-size", type=int, default=1, help="processes per engine that split its weights (default 1)")
    add(
        "--decode-context-parallel-size",
        type=int,
        default=1,
        help="TP ranks per engine that split its KV cache's tokens (default 1)",
    )
    add("--dcp-kv-interleave", type=int, default=1, help="consecutive positions per DCP rank in turn (default 1)")
    add("--allow-oversubscribe", action="store_true", help="allow more TP processes than an engine's cores")
    add(
        "--batch-invariant",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="engines compute with the batch-invariant kernels (default); --no-batch-invariant: torch's",
    )
    add(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="engines keep a prefix cache of KV blocks (default); --no-prefix-caching: every prompt in full",
    )
    add(
        "--api-key",
        action="append",
        default=[],
        help="accept `authorization: Bearer KEY` (repeatable; keys in $DPGATE_API_KEYS are accepted too)",
    )
    add(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="log one line per call with its x-request-id, code and duration (default); it costs 2-6 us a call",
    )
    # Chat flags: checked by the engines (an engine's refusal ends serve with exit 2 and its sentence).
    add("--chat-template", metavar="FILE", help="engines' chat template file, replacing the model's own")
    add("--reasoning-parser", help="engines' reasoning parser: think or none (default: by the model)")
    add("--reasoning-markers", metavar="START,END", help="engines' reasoning markers (default: <think>,</think>)")
    add("--tool-call-parser", help="engines' tool-call parser: hermes or none (default: by the model)")
    add(
        "--grammar-compile-timeout-s",
        type=float,
        help="engines' budget for one grammar, seconds (default: the engine's)",
    )
    add_log_format_argument(parser, deprecated_json_flag=True)  # the gateway's and every engine's
    add_prefix_cache_sharing_argument(parser)
    add_routing_arguments(parser)
    add_limit_arguments(parser)
    add_http_arguments(parser, default_port=DEFAULT_HTTP_PORT)
    add("--no-http", action="store_true", help="serve no OpenAI HTTP API (gRPC only)")


def engine_command(args: argparse.Namespace, rank: int, port: int) -> list[str]:
    command = [
        sys.executable, "-m", "dpgate.cli", "engine",
        "--host", "127.0.0.1", "--port", str(port),
        "--data-parallel-rank", str(rank), "--data-parallel-size", str(args.data_parallel_size),
        "--log-format", args.log_format,
    ]  # fmt: skip
    for flag, value in (("--model", args.model), ("--dtype", args.dtype), ("--max-model-len", args.max_model_len)):
        if value is not None:
            command += [flag, str(value)]
    if not args.batch_invariant:
        command.append("--no-batch-invariant")
    if not args.prefix_caching:
        command.append("--no-prefix-caching")
    command += [
        "--tensor-parallel-size", str(args.tensor_parallel_size),
        "--decode-context-parallel-size", str(args.decode_context_parallel_size),
        "--dcp-kv-interleave", str(args.dcp_kv_interleave),
    ]  # fmt: skip
    if args.allow_oversubscribe:
        command.append("--allow-oversubscribe")
    for flag in ("--chat-template", "--reasoning-parser", "--reasoning-markers", "--tool-call-parser",
                 "--grammar-compile-timeout-s"):  # fmt: skip
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            command += [flag, str(value)]
    if args.engine_metrics_port is not None:
        command += ["--metrics-port", str(args.engine_metrics_port + rank)]
    # Engines on one host share its cores: oversubscribed torch threads spin against each other.
    # One engine has the whole mask and measures how many of its CPUs help (engines/runner/thread_choice.py).
    if args.data_parallel_size > 1:
        command += ["--num-threads", str(max(1, usable_cores() // args.data_parallel_size))]
    return command


def stop_engines(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(ENGINE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def serve(config: GatewayConfig, processes: list[subprocess.Popen]) -> int:
    from gateway.server import GatewayServer

    gateway = GatewayServer(config)
    port = await gateway.start()
    http = f", OpenAI HTTP API on http://{config.host}:{gateway.http_port}" if gateway.http_port is not None else ""
    print(f"dpgate gateway listening on {config.host}:{port}{http}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    status = 0
    while not stop.is_set():
        exited = [(rank, p.returncode) for rank, p in enumerate(processes) if p.poll() is not None]
        if any(code == 2 for _, code in exited):
            # An engine refused its flags (it printed why): the others would refuse them too.
            logger.error("an engine refused its flags; stopping")
            status = 2
            break
        if exited and len(exited) == len(processes):
            logger.error("every engine exited (rank, status): %s", exited)
            status = 1
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    await gateway.drain()
    return status


def check_engine_metrics_ports(args: argparse.Namespace) -> None:
    """The engines' metrics ports (BASE..BASE+N-1) must be real ports the gateway does not use; raises ConfigError."""
    base = args.engine_metrics_port
    if base is None:
        return
    last = base + args.data_parallel_size - 1
    if base < 1 or last > 65535:
        raise ConfigError(f"--engine-metrics-port {base}: ports {base}..{last} must lie within 1..65535.")
    for flag, port in (("--port", args.port), ("--metrics-port", args.metrics_port)):
        if port is not None and base <= port <= last:
            raise ConfigError(f"--engine-metrics-port {base}: the engines' ports {base}..{last} include {flag} {port}.")


def engine_environment(token: str) -> dict[str, str]:
    """The engines' environment: this process's, plus the run's engine token (never on a command
    line, which any local user can read)."""
    return {**os.environ, ENGINE_TOKEN_ENV: token}


def gateway_config(args: argparse.Namespace, ports: list[int], engine_token: str | None = None) -> GatewayConfig:
    """The validated config of the gateway in front of engines on `ports`; raises ConfigError."""
    return validate_config(
        GatewayConfig(
            engines=tuple(f"127.0.0.1:{port}" for port in ports),
            host=args.host,
            port=args.port,
            metrics_port=args.metrics_port,
            api_keys=tuple(args.api_key) + api_keys_from_environment(),
            engine_token=engine_token,
            log_format=args.log_format,
            access_log=args.access_log,
            prefix_cache_sharing=args.prefix_cache_sharing,
            **routing_from_args(args),
            **limits_from_args(args),
            **http_from_args(args),
            # Health says SERVING only once every engine started here passed the handshake.
            ready_data_parallel_size=args.data_parallel_size,
            # Engines load a model before answering; a short drain keeps Ctrl-C snappy.
            drain_grace_s=1.0,
            shutdown_timeout_s=10.0,
        )
    )


def run(args: argparse.Namespace) -> int:
    if args.data_parallel_size < 1:
        message = attribute("--data-parallel-size must be at least 1.", args)
        print(f"dpgate serve: error: {message}", file=sys.stderr)
        return 2
    ports = [free_port() for _ in range(args.data_parallel_size)]  # below the ephemeral range: dpgate/ports.py
    # A new token each run: the engines serve only this gateway (dpgate/engine_token.py).
    engine_token = new_engine_token()
    try:
        check_engine_metrics_ports(args)
        config = gateway_config(args, ports, engine_token)
    except ConfigError as error:
        print(f"dpgate serve: error: {attribute(str(error), args)}", file=sys.stderr)
        return 2
    from gateway.server import ensure_bindable

    try:
        ensure_bindable(config.host, config.port, "--port")  # before any engine is started
        if config.http_port is not None:
            ensure_bindable(config.host, config.http_port, "--http-port")
    except ConfigError as error:
        print(f"dpgate serve: error: {attribute(str(error), args)}", file=sys.stderr)
        return 2
    configure_logging(config.log_format)
    environment = engine_environment(engine_token)
    processes = [subprocess.Popen(engine_command(args, rank, port), env=environment) for rank, port in enumerate(ports)]
    import uvloop

    try:
        return uvloop.run(serve(config, processes))
    except ConfigError as error:  # a port that cannot be bound
        print(f"dpgate serve: error: {attribute(str(error), args)}", file=sys.stderr)
        return 2
    finally:
        stop_engines(processes)
