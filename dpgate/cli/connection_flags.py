"""The connection flags of the client commands (`dpgate generate`, `dpgate chat`), read in one place.

`--address`, `--rank`, `--timeout`, `--api-key` (or $DPGATE_API_KEY) and the TLS flags mean the
same for every command that talks to a server, so they are declared and checked here, and
`client_from_args` turns them into a DpgateClient. A value refused before connecting raises
FlagError with the one sentence the command prints (exit 2).
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from dpgate.client.clients import DpgateClient, TlsOptions
from dpgate.client.options import MAX_RANK

API_KEY_ENV = "DPGATE_API_KEY"


class FlagError(Exception):
    """A flag value the command refuses before connecting; the message is the one sentence shown."""


def add_connection_arguments(parser: argparse.ArgumentParser, *, rank_help: str, timeout_help: str) -> None:
    """--rank, --timeout, --api-key and the TLS flags (--address is the command's, placed first)."""
    add = parser.add_argument
    add("--rank", default=None, help=rank_help)
    add("--timeout", type=float, default=None, help=timeout_help)
    add("--api-key", default=None, help=f"sent as `authorization: Bearer KEY` (default: ${API_KEY_ENV})")
    add("--tls", action="store_true", help="connect with TLS, trusting the system's roots")
    add("--tls-ca", help="PEM CA bundle that signed the server's certificate (implies --tls)")
    add("--tls-cert", help="PEM client certificate for mutual TLS (implies --tls; needs --tls-key)")
    add("--tls-key", help="PEM private key of --tls-cert")
    add("--tls-server-name", help="name the server's certificate must carry, if not the address's host (implies --tls)")


def client_from_args(args: argparse.Namespace) -> DpgateClient:
    """A blocking client for the flags of `add_connection_arguments` (and --address)."""
    if not args.address.strip():
        raise FlagError("--address must be HOST:PORT, got an empty string.")
    return DpgateClient(
        args.address, rank=_rank(args.rank), api_key=_api_key(args.api_key), timeout=_timeout(args.timeout),
        tls=_tls(args),
    )  # fmt: skip


def _rank(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or int(text) > MAX_RANK:
        raise FlagError(f"--rank must be an unsigned 32-bit integer (0..{MAX_RANK}), got {value!r}.")
    return int(text)


def _timeout(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise FlagError(f"--timeout must be a number of seconds above 0, got {value}.")
    return value


def _api_key(value: str | None) -> str | None:
    flag = "--api-key"
    if value is None:
        value, flag = os.environ.get(API_KEY_ENV) or None, f"${API_KEY_ENV}"
    if value is not None and (not value.isascii() or not value.isprintable() or " " in value):
        raise FlagError(f"{flag} must be printable ASCII without spaces.")
    return value


def _read(path: str | None, flag: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise FlagError(f"{flag} {path!r} is not a readable file ({error.strerror}).") from None


def _tls(args: argparse.Namespace) -> TlsOptions | None:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise FlagError("--tls-cert and --tls-key must be given together.")
    if args.tls_server_name is not None and not args.tls_server_name.strip():
        raise FlagError("--tls-server-name must not be empty.")
    if not (args.tls or args.tls_ca or args.tls_cert or args.tls_server_name):
        return None
    return TlsOptions(
        root_certificates=_read(args.tls_ca, "--tls-ca"),
        certificate_chain=_read(args.tls_cert, "--tls-cert"),
        private_key=_read(args.tls_key, "--tls-key"),
        server_name=args.tls_server_name,
    )
