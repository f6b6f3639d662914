"""`dpgate chat`'s flags: a bad one exits 2 with one sentence before connecting; no server exits 1."""

from __future__ import annotations

import json

import pytest

from dpgate.cli import main
from tests.support.gateway_processes import free_port


@pytest.mark.parametrize(
    ("flags", "sentence"),
    [
        (["--tool-choice", "required"], "--tool-choice required needs --tools."),
        (["--max-tokens", "0"], "--max-tokens must be at least 1, got 0."),
        (["--rank", "-1"], "--rank must be an unsigned 32-bit integer"),
        (["--timeout", "0"], "--timeout must be a number of seconds above 0, got 0.0."),
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key must be given together."),
        (["--tools", "/nonexistent/tools.json"], "--tools '/nonexistent/tools.json' is not a readable file"),
    ],
)
def test_a_bad_flag_exits_2_with_one_sentence(flags: list[str], sentence: str, capsys) -> None:
    assert main(["chat", "--address", "127.0.0.1:1", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dpgate chat: error: {sentence}") and err.count("\n") == 1


def test_a_tools_file_is_checked_and_a_named_choice_must_be_one_of_its_tools(tmp_path, capsys) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "get_weather", "parameters": {"type": "object"}}]))
    assert main(["chat", "--address", "127.0.0.1:1", "--tools", str(tools), "--tool-choice", "get_time"]) == 2
    assert "one of the tools' names, got 'get_time'" in capsys.readouterr().err
    tools.write_text(json.dumps([{"name": "get_weather", "parameters": "not a schema"}]))
    assert main(["chat", "--address", "127.0.0.1:1", "--tools", str(tools)]) == 2
    assert "tools[0].parameters must be a JSON schema object" in capsys.readouterr().err
    tools.write_text("{not json")
    assert main(["chat", "--address", "127.0.0.1:1", "--tools", str(tools)]) == 2
    assert "is not JSON" in capsys.readouterr().err


def test_an_unreachable_server_exits_1_with_the_error_line(capsys) -> None:
    assert main(["chat", "--address", f"127.0.0.1:{free_port()}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dpgate chat: UNAVAILABLE: ") and err.count("\n") == 1
