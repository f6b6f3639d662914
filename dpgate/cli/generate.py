"""`dpgate generate "PROMPT"`: stream a completion from a running server to the terminal.

The text goes to stdout as it arrives, flushed per delta, and nothing else does, so the command
pipes cleanly. When stderr is a terminal a status line there shows the time to first token and the
decode rate while tokens arrive, and a final line with the token counts and finish reason
(dpgate/cli/generate_status.py). Bad flags exit 2 with one sentence naming the flag; a failed call
exits 1 with the single line `dpgate generate: CODE: message`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from dpgate.cli.connection_flags import FlagError, add_connection_arguments, client_from_args
from dpgate.cli.generate_status import GenerationClock, TerminalStatus, shares_terminal
from dpgate.client.clients import DpgateClient, DpgateError, GenerationOptions


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
    add_connection_arguments(
        parser,
        rank_help="pin the call to this data-parallel rank (metadata x-data-parallel-rank)",
        timeout_help="deadline of the whole call in seconds (default: none)",
    )
    add("--no-status", action="store_true", help="no status line on the terminal")
    add("--verbose", action="store_true", help="without a status line: print the finish reason and token counts")


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
        client = client_from_args(args)
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
