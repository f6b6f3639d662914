"""docs/operations.md lists every flag of gateway, engine and serve as the parsers define them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dpgate.cli import command_parser
from tools import flags_table


def test_docs_operations_is_up_to_date_with_the_parsers() -> None:
    assert flags_table.main(["--check"]) == 0, "run `python -m tools.flags_table` and commit docs/operations.md"


@pytest.mark.parametrize("command", flags_table.COMMANDS)
def test_every_flag_has_a_row_under_its_command(command: str) -> None:
    document = flags_table.DOC.read_text()
    section = document.split(f"### `dpgate {command}`", 1)[1].split("### ", 1)[0]
    _, parser = command_parser(command)
    for action in parser._actions:
        hidden = action.help == argparse.SUPPRESS  # a deprecated spelling: kept working, not documented
        for option in action.option_strings:
            if action.dest != "help":
                assert (f"`{option}`" in section) != hidden, option


def test_a_row_shows_type_default_and_help() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (default: %(default)s)")
    parser.add_argument("--engine", action="append", default=[], metavar="HOST:PORT", help="an engine | repeat")
    parser.add_argument("--log-json", action="store_true", help="JSON logs")
    parser.add_argument("--policy", choices=["a", "b"], default="a", help="pick")
    parser.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=True, help="kernels")
    assert flags_table.flag_rows(parser) == [
        ("`--block-size`", "integer", "`16`", "tokens per block (default: 16)"),
        ("`--engine`", "text (`HOST:PORT`), repeatable", "none", "an engine \\| repeat"),
        ("`--log-json`", "switch", "off", "JSON logs"),
        ("`--policy`", "one of `a`, `b`", "`a`", "pick"),
        ("`--batch-invariant`, `--no-batch-invariant`", "switch", "on", "kernels"),
    ]


def test_check_fails_on_a_stale_document_and_regeneration_fixes_it(tmp_path: Path, monkeypatch) -> None:
    stale = tmp_path / "operations.md"
    current = flags_table.DOC.read_text()
    stale.write_text(current.replace("| `--port` |", "| `--old-port` |", 1))
    monkeypatch.setattr(flags_table, "DOC", stale)
    assert flags_table.main(["--check"]) == 1
    assert flags_table.main([]) == 0
    assert stale.read_text() == current
    assert flags_table.main(["--check"]) == 0


def test_prose_outside_the_markers_is_kept_and_missing_markers_are_refused() -> None:
    document = f"intro\n{flags_table.BEGIN}\nold\n{flags_table.END}\noutro\n"
    rendered = flags_table.render(document)
    assert rendered.startswith("intro\n") and rendered.endswith("\noutro\n") and "\nold\n" not in rendered
    with pytest.raises(ValueError, match="must hold the markers"):
        flags_table.render("no markers here")
