"""The `dpgate` command: one entry point that dispatches to each part's own command module.

Each subcommand lives in the package that owns it and is imported only when chosen, so
`dpgate gateway` never imports torch. A command module provides `add_arguments(parser)` and
`run(args) -> int`; bad flags end with exit status 2 and one sentence naming the flag. `serve`,
`engine` and `gateway` also take `--config FILE` (dpgate/config_file.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from dpgate import __version__
from dpgate.config_file import add_config_argument, parse_args_with_config

# subcommand -> (module providing add_arguments/run, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("dpgate.cli.serve", "a gateway on 127.0.0.1:50051 plus its engines (the quick start)"),
    "engine": ("engines.serving.engine_command", "run one engine: a model behind the dpgate.v1 services"),
    "gateway": ("gateway.gateway_command", "run the front door in front of engines (--engine HOST:PORT)"),
    "generate": ("dpgate.cli.generate", "stream a completion from a running server"),
    "chat": ("dpgate.cli.chat", "a conversation with a running server on the terminal (history, tools, Ctrl-C)"),
    "health": ("dpgate.cli.health", "check a running server's grpc.health.v1 status (exit 0 when SERVING)"),
    "e2e": ("dpgate.e2e.command", "run a topology end to end in stages (preflight .. verdict) and write a sentinel"),
}
# The long-running commands also read their flags from a TOML file (dpgate/config_file.py).
# Packages a command needs that only an extra installs: a gateway host leaves the e2e runner's out.
EXTRA_PACKAGES = {"hypothesis": "e2e", "jsonschema": "e2e"}
CONFIG_FILE_COMMANDS = frozenset({"serve", "engine", "gateway"})


def top_level_parser() -> argparse.ArgumentParser:
    """The parser for `dpgate` itself: lists the subcommands without importing any of them."""
    lines = "\n".join(f"  {name:<10} {help_text}" for name, (_, help_text) in SUBCOMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="dpgate",
        description="dpgate: a gRPC inference gateway and its engines.",
        epilog=f"commands:\n{lines}\n\nRun `dpgate COMMAND --help` for a command's flags.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dpgate {__version__}")
    parser.add_argument("command", choices=sorted(SUBCOMMANDS), metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        top_level_parser().print_help(sys.stderr)
        return 2
    if argv[0].startswith("-") or argv[0] not in SUBCOMMANDS:
        top_level_parser().parse_args(argv[:1])  # prints help/version or exits 2 naming the command
        return 2
    name, rest = argv[0], argv[1:]
    try:
        module, parser = command_parser(name)
    except ModuleNotFoundError as error:
        extra = EXTRA_PACKAGES.get((error.name or "").partition(".")[0])
        if extra is None:
            raise
        print(f"dpgate {name}: needs the '{extra}' extra ({error.name} is not installed): "
              f"pip install 'dpgate[{extra}]'", file=sys.stderr)  # fmt: skip
        return 2
    args = parse_args_with_config(parser, rest) if name in CONFIG_FILE_COMMANDS else parser.parse_args(rest)
    return int(module.run(args) or 0)


def command_parser(name: str) -> tuple[ModuleType, argparse.ArgumentParser]:
    """The subcommand's module and its full parser (with --config where it takes one), exactly as
    `dpgate NAME` parses its flags; also used by tests that check flags written elsewhere
    (deploy/kubernetes/, docs/operations.md) against the command."""
    module_name, help_text = SUBCOMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"dpgate {name}", description=help_text)
    module.add_arguments(parser)
    if name in CONFIG_FILE_COMMANDS:
        add_config_argument(parser)
    return module, parser


if __name__ == "__main__":
    sys.exit(main())
