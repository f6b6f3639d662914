"""`dpgate generate` against real gateways: its output, its flags and its exit statuses.

The command runs in this process (dpgate.cli.main) with stdout and stderr captured, so neither is
a terminal and no status line is drawn: what a pipe receives is exactly the generated text. The
terminal's view is test_generate_tmux_e2e.py's.
"""

from __future__ import annotations

import re

import pytest

from dpgate.cli import main
from gateway.forwarding import UNAUTHENTICATED_MESSAGE
from tests.dpgate.conftest import API_KEY, SERVER_NAME
from tests.support.gateway_processes import free_port


@pytest.fixture(autouse=True)
def no_key_in_the_environment(monkeypatch):
    monkeypatch.delenv("DPGATE_API_KEY", raising=False)


def generate(address: str, *flags: str) -> int:
    return main(["generate", "hello", "--address", address, "--max-tokens", "5", *flags])


def test_the_text_alone_goes_to_stdout(plain_gateway, synthetic_pair, capsys):
    before = synthetic_pair[1].requests_total().get("GenerateStream", 0)
    assert generate(plain_gateway.address, "--rank", "1", "--timeout", "10") == 0
    assert capsys.readouterr() == ("xxxxx\n", "")
    assert synthetic_pair[1].requests_total()["GenerateStream"] == before + 1
    assert generate(plain_gateway.address, "--verbose") == 0
    assert capsys.readouterr() == ("xxxxx\n", "[finish: length, 0 prompt + 5 generated tokens]\n")


@pytest.mark.parametrize(
    ("flags", "sentence"),
    [
        (["--rank", "-1"], "--rank must be an unsigned 32-bit integer (0..4294967295), got '-1'."),
        (["--rank", "4294967296"], "--rank must be an unsigned 32-bit integer (0..4294967295), got '4294967296'."),
        (["--timeout", "0"], "--timeout must be a number of seconds above 0, got 0.0."),
        (["--timeout", "nan"], "--timeout must be a number of seconds above 0, got nan."),
        (["--api-key", "two words"], "--api-key must be printable ASCII without spaces."),
        (["--tls-key", "k.pem"], "--tls-cert and --tls-key must be given together."),
        (
            ["--tls-ca", "/no/such/ca.pem"],
            "--tls-ca '/no/such/ca.pem' is not a readable file (No such file or directory).",
        ),
        (["--tls-server-name", ""], "--tls-server-name must not be empty."),
        (["--address", ""], "--address must be HOST:PORT, got an empty string."),
    ],
)
def test_bad_flags_exit_2_with_one_sentence(capsys, flags, sentence):
    assert main(["generate", "hello", *flags]) == 2
    assert capsys.readouterr() == ("", f"dpgate generate: error: {sentence}\n")


def test_a_bad_key_in_the_environment_is_named(monkeypatch, capsys):
    monkeypatch.setenv("DPGATE_API_KEY", "caf\u00e9")
    assert main(["generate", "hello"]) == 2
    assert (
        capsys.readouterr().err == "dpgate generate: error: $DPGATE_API_KEY must be printable ASCII without spaces.\n"
    )


def test_a_malformed_number_is_argparses_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["generate", "hello", "--timeout", "soon"])
    assert info.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == "dpgate generate: error: argument --timeout: invalid float value: 'soon'"
    )


def test_failed_calls_exit_1_with_one_line(plain_gateway, capsys):
    assert generate(plain_gateway.address, "--rank", "9") == 1
    expected = "data parallel rank 9 is not connected to this gateway; connected ranks: [0, 1]"
    assert capsys.readouterr() == ("", f"dpgate generate: INVALID_ARGUMENT: {expected}\n")
    # A deadline in mid-stream: the tokens so far, their line ended, then the error line.
    assert generate(plain_gateway.address, "--max-tokens", "200", "--timeout", "0.3") == 1
    out, err = capsys.readouterr()
    assert re.fullmatch(r"x+\n", out) and len(out) < 200
    assert re.fullmatch(r"dpgate generate: DEADLINE_EXCEEDED: [^\n]+\n", err)
    assert generate(f"127.0.0.1:{free_port()}") == 1
    assert re.fullmatch(r"dpgate generate: UNAVAILABLE: [^\n]+\n", capsys.readouterr().err)


def test_the_api_key_comes_from_the_flag_or_the_environment(key_gateway, monkeypatch, capsys):
    assert generate(key_gateway.address) == 1
    assert capsys.readouterr() == ("", f"dpgate generate: UNAUTHENTICATED: {UNAUTHENTICATED_MESSAGE}\n")
    monkeypatch.setenv("DPGATE_API_KEY", API_KEY)
    assert generate(key_gateway.address) == 0
    assert capsys.readouterr().out == "xxxxx\n"
    monkeypatch.setenv("DPGATE_API_KEY", "wrong-key")
    assert generate(key_gateway.address) == 1
    assert generate(key_gateway.address, "--api-key", API_KEY) == 0  # the flag wins
    assert capsys.readouterr().out == "xxxxx\n"


def test_tls_flags(tls_gateway, mtls_gateway, pki, capsys):
    assert generate(tls_gateway.address, "--tls-ca", str(pki.ca.cert)) == 0
    assert capsys.readouterr().out == "xxxxx\n"
    mutual = ["--tls-ca", str(pki.ca.cert), "--tls-cert", str(pki.client.cert), "--tls-key", str(pki.client.key)]
    assert generate(mtls_gateway.address, *mutual, "--tls-server-name", SERVER_NAME) == 0
    assert capsys.readouterr().out == "xxxxx\n"
    assert generate(mtls_gateway.address, *mutual) == 1  # its certificate names SERVER_NAME only
    assert capsys.readouterr().err.startswith("dpgate generate: UNAVAILABLE: ")
