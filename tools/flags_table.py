"""The flag tables of docs/operations.md, generated from the commands' real argparse parsers.

    python -m tools.flags_table          # rewrite the generated part of docs/operations.md
    python -m tools.flags_table --check  # exit 1 if it is out of date (tests/tools/test_flags_table.py)

Only the text between the BEGIN and END markers is generated; the prose around it is kept.
Each row gives a flag (the config-file key is its name without the dashes), what it takes, its
default as the parser holds it, and its help text, so a flag added to a parser shows up here by
regenerating, never by hand.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpgate.cli import command_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
BEGIN = "<!-- BEGIN GENERATED FLAGS: python -m tools.flags_table -->"
END = "<!-- END GENERATED FLAGS -->"
COMMANDS = ("gateway", "engine", "serve")
_TYPE_NAMES = {int: "integer", float: "number", str: "text"}


def flag_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str, str]]:
    """(flags, value, default, help) for each option of `parser`, in the order it lists them."""
    rows = []
    for action in parser._actions:
        if action.dest == "help" or not action.option_strings or action.help == argparse.SUPPRESS:
            continue  # hidden flags (deprecated spellings) are not documented
        rows.append(
            (", ".join(f"`{o}`" for o in action.option_strings), _value(action), _default(action), _help(action))
        )
    return rows


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "switch"
    if action.choices is not None:
        taken = "one of " + ", ".join(f"`{choice}`" for choice in action.choices)
    else:
        taken = _TYPE_NAMES.get(action.type or str, getattr(action.type, "__name__", "text"))
        if action.metavar:
            taken = f"{taken} (`{action.metavar}`)"
    return f"{taken}, repeatable" if isinstance(action, argparse._AppendAction) else taken


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default == []:
        return "none"
    if isinstance(default, bool):
        return "on" if default else "off"
    return f"`{default}`"


def _help(action: argparse.Action) -> str:
    text = (action.help or "").replace("%(default)s", str(action.default))
    return text.replace("|", "\\|").replace("\n", " ")


def generated_section() -> str:
    parts = [BEGIN]
    for name in COMMANDS:
        _, parser = command_parser(name)
        parts += [
            "",
            f"### `{parser.prog}`",
            "",
            "| flag | takes | default | what it does |",
            "|---|---|---|---|",
        ]
        parts += [f"| {flags} | {value} | {default} | {text} |" for flags, value, default, text in flag_rows(parser)]
    parts += ["", END]
    return "\n".join(parts)


def render(document: str) -> str:
    """`document` with its generated section replaced; raises ValueError without both markers."""
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC} must hold the markers {BEGIN!r} and {END!r}, in that order.")
    return document[:start] + generated_section() + document[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.flags_table", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/operations.md is out of date")
    args = parser.parse_args(argv)
    current = DOC.read_text()
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(f"{DOC} is out of date with the parsers: run `python -m tools.flags_table`.", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
