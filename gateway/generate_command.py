"""`dpgate generate "PROMPT"`: stream a completion from a running server to the terminal.

The text goes to stdout as it arrives, flushed per delta, and nothing else does, so the command
pipes cleanly. When stderr is a terminal a status line there shows the time to first token and the
decode rate while tokens arrive, and a final line with the token counts and finish reason
(gateway/generate_status.py). Bad flags exit 2 with one sentence naming the flag; a failed call
exits 1 with the single line `dpgate generate: CODE: message`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from gateway.client import DpgateClient, DpgateError, GenerationOptions, TlsOptions
from gateway.client_options import MAX_RANK
from gateway.generate_status import GenerationClock, TerminalStatus, shares_terminal

API_KEY_ENV = "DPGATE_API_KEY"


class FlagError(Exception):
    """A flag value the command refuses before connecting; the message is the one sentence shown."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("prompt", help="prompt text")
    add("--address", default="127.0.0.1:50051", help="server HOST:PORT (default: %(default)s)")
    add("--max-tokens", type=int, default=128, help="tokens to generate (default: %(default)s)")
    add("--temperature", type=float, default=None, help="0 for greedy (default: the server's)")
    add("--top-p", type=float, default=None)
    add("--top-k", type=int, default=0)
    add("--seed", type=int, default=None)
    add("--stop", action="append", default=[], help="stop string (repeatable)")
    add("--ignore-eos", action="store_true")
    add("--rank", default=None, help="pin the call to this data-parallel rank (metadata x-data-parallel-rank)")
    add("--timeout", type=float, default=None, help="deadline of the whole call in seconds (default: none)")
    add("--api-key", default=None, help=f"sent as `authorization: Bearer KEY` (default: ${API_KEY_ENV})")
    add("--tls", action="store_true", help="connect with TLS, trusting the system's roots")
    add("--tls-ca", help="PEM CA bundle that signed the server's certificate (implies --tls)")
    add("--tls-cert", help="PEM client certificate for mutual TLS (implies --tls; needs --tls-key)")
    add("--tls-key", help="PEM private key of --tls-cert")
    add("--tls-server-name", help="name the server's certificate must carry, if not the address's host (implies --tls)")
    add("--no-status", action="store_true", help="no status line on the terminal")
    add("--verbose", action="store_true", help="without a status line: print the finish reason and token counts")


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


def _options(args: argparse.Namespace) -> GenerationOptions:
    # Sampling values are the server's to judge: it names the field and the rule (exit 1).
    return GenerationOptions(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
    )


def _client(args: argparse.Namespace) -> DpgateClient:
    if not args.address.strip():
        raise FlagError("--address must be HOST:PORT, got an empty string.")
    return DpgateClient(
        args.address, rank=_rank(args.rank), api_key=_api_key(args.api_key), timeout=_timeout(args.timeout),
        tls=_tls(args),
    )  # fmt: skip


def _status(args: argparse.Namespace) -> TerminalStatus | None:
    if args.no_status or not sys.stderr.isatty() or os.environ.get("TERM") == "dumb":
        return None
    return TerminalStatus(sys.stderr, is_footer=shares_terminal(sys.stdout, sys.stderr))


def _print_stream(client: DpgateClient, args: argparse.Namespace, status: TerminalStatus | None) -> None:
    """Write the stream's text to stdout as it arrives; raise DpgateError as the client does."""
    clock = GenerationClock(started=time.monotonic())
    wrote_text = False
    try:
        with client.stream(args.prompt, _options(args)) as stream:
            if status is not None:
                status.show(clock.live_text(time.monotonic()))
            for delta in stream:
                clock.on_tokens(len(delta.token_ids), time.monotonic())
                if status is not None:
                    status.clear()
                if delta.text:
                    sys.stdout.write(delta.text)
                    sys.stdout.flush()
                    wrote_text = True
                    if status is not None:
                        status.wrote(delta.text)
                if status is not None:
                    status.show(clock.live_text(time.monotonic()))
    finally:
        # Whatever ended the stream, the terminal gets its line back whole.
        if status is not None:
            status.clear()
        if wrote_text:
            sys.stdout.write("\n")
            sys.stdout.flush()
    finish = stream.finish
    assert finish is not None  # the stream raises DpgateError when it ends without finish info
    if status is not None:
        status.finish(clock.final_text(finish, time.monotonic()))
    elif args.verbose:
        usage = finish.usage
        print(
            f"[finish: {finish.reason}, {usage.prompt_tokens} prompt + {usage.completion_tokens} generated tokens]",
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    try:
        client = _client(args)
    except FlagError as error:
        print(f"dpgate generate: error: {error}", file=sys.stderr)
        return 2
    with client:
        try:
            _print_stream(client, args, _status(args))
        except DpgateError as error:
            print(f"dpgate generate: {error.code.name}: {error.message}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
    return 0
