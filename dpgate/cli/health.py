"""`dpgate health --address HOST:PORT`: one grpc.health.v1 Check, for container and orchestrator probes.

A Docker HEALTHCHECK or a compose `healthcheck` runs a command and reads its exit status, so this
prints one line and exits 0 when the server answers SERVING, 1 for anything else (NOT_SERVING, a
service the server does not know, no answer), and 2 for bad flags. It works against a gateway
(health is exempt from API keys there) and an engine alike, and imports neither torch nor the
engines, so it is cheap to run every few seconds.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.config import ConfigError, parse_address

DEFAULT_TIMEOUT_S = 5.0
EXIT_SERVING, EXIT_UNHEALTHY, EXIT_BAD_FLAGS = 0, 1, 2
_STATUS_NAMES = {value.number: value.name for value in health_pb2.HealthCheckResponse.ServingStatus.DESCRIPTOR.values}
# Codes that mean the server was never reached (or did not answer in time), as opposed to a
# server that answered with an error.
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM bytes for a TLS channel: the CA that signed the server (None: the system's roots) and an
    optional client certificate for servers that require mutual TLS."""

    root_certificates: bytes | None
    certificate_chain: bytes | None
    private_key: bytes | None
    server_name: str | None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--address", required=True, metavar="HOST:PORT", help="the gateway or engine to check")
    add("--service", default="", help='service name to check (default: the server as a whole, "")')
    add("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the answer (default 5)")
    add("--tls", action="store_true", help="connect with TLS, trusting the system's CA roots")
    add("--tls-ca", metavar="FILE", help="connect with TLS, trusting this PEM CA bundle (implies --tls)")
    add("--tls-cert", metavar="FILE", help="PEM client certificate, for a gateway started with --tls-client-ca")
    add("--tls-key", metavar="FILE", help="PEM private key for --tls-cert")
    add("--tls-server-name", metavar="NAME", help="name the server's certificate must carry (default: HOST)")


def _read_pem(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise ConfigError(f"{flag} {path!r} cannot be read ({error.strerror}).") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{flag} {path!r} is not a PEM file.")
    return data


def tls_from_args(args: argparse.Namespace) -> TlsFiles | None:
    """The TLS settings the flags ask for (None: plaintext); raises ConfigError naming the flag."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key must be given together.")
    wants_tls = args.tls or args.tls_ca is not None or args.tls_cert is not None or args.tls_server_name is not None
    if not wants_tls:
        return None
    return TlsFiles(
        root_certificates=_read_pem(args.tls_ca, "--tls-ca") if args.tls_ca else None,
        certificate_chain=_read_pem(args.tls_cert, "--tls-cert") if args.tls_cert else None,
        private_key=_read_pem(args.tls_key, "--tls-key") if args.tls_key else None,
        server_name=args.tls_server_name,
    )


def _channel(address: str, tls: TlsFiles | None) -> grpc.Channel:
    options = [("grpc.enable_retries", 0)]
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    credentials = grpc.ssl_channel_credentials(tls.root_certificates, tls.private_key, tls.certificate_chain)
    return grpc.secure_channel(address, credentials, options=options)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def check(address: str, service: str, timeout_s: float, tls: TlsFiles | None) -> tuple[int, str]:
    """Ask `address` for `service`'s health once; returns (exit status, the line to print)."""
    with _channel(address, tls) as channel:
        try:
            request = health_pb2.HealthCheckRequest(service=service)
            response = health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout_s)
        except grpc.RpcError as error:
            code, details = error.code(), _one_line(error.details() or "")
            if code in _UNREACHABLE:
                return EXIT_UNHEALTHY, f"{address}: not reachable ({code.name}: {details})"
            if code == grpc.StatusCode.NOT_FOUND:
                return EXIT_UNHEALTHY, f"{address}: service {service!r} is unknown to the server (NOT_FOUND)"
            return EXIT_UNHEALTHY, f"{address}: health check failed ({code.name}: {details})"
    name = _STATUS_NAMES.get(response.status, str(response.status))
    if response.status == health_pb2.HealthCheckResponse.SERVING:
        return EXIT_SERVING, f"{address}: SERVING"
    suffix = f" (service {service!r})" if service else ""
    return EXIT_UNHEALTHY, f"{address}: {name}{suffix}"


def run(args: argparse.Namespace) -> int:
    try:
        parse_address(args.address, "--address")
        if not args.timeout > 0:
            raise ConfigError(f"--timeout {args.timeout} must be greater than 0.")
        tls = tls_from_args(args)
    except ConfigError as error:
        print(f"dpgate health: error: {error}", file=sys.stderr)
        return EXIT_BAD_FLAGS
    status, line = check(args.address, args.service, args.timeout, tls)
    print(line, flush=True)
    return status
