"""`--config FILE` for gateway, engine and serve: the file sets values, flags override it, and bad
keys or values exit 2 with one sentence naming the file and the key. In process, with the real
parsers and the real validation (nothing is started: every case fails or is parsed before that).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpgate.cli import command_parser, main
from dpgate.config_file import parse_args_with_config


def write(tmp_path: Path, text: str, name: str = "dpgate.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def parse(command: str, *argv: str):
    _, parser = command_parser(command)
    return parse_args_with_config(parser, list(argv))


def refused(capsys: pytest.CaptureFixture[str], command: str, *argv: str) -> str:
    """The one line of stderr of a parse that must exit 2."""
    with pytest.raises(SystemExit) as exit_info:
        parse(command, *argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(lines)
    return lines[-1]  # argparse prints the usage line first


def test_the_file_sets_values_with_either_spelling_of_a_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'engine = ["127.0.0.1:50061", "127.0.0.1:50062"]\nport = 0\nmax_in_flight = 7\n'
        'log_format = "json"\npolicy = "round-robin"\nkeepalive-time = 12.5\n',
    )
    args = parse("gateway", "--config", path)
    assert args.engine == ["127.0.0.1:50061", "127.0.0.1:50062"]
    assert (args.port, args.max_in_flight, args.log_format, args.policy) == (0, 7, "json", "round-robin")
    assert args.keepalive_time == 12.5
    assert args.health_interval == parse("gateway").health_interval  # keys not in the file keep their default


def test_flags_on_the_command_line_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'engine = ["127.0.0.1:50061", "127.0.0.1:50062"]\nport = 6000\nmax-in-flight = 7\n')
    args = parse("gateway", "--port", "6001", "--config", path, "--engine", "10.0.0.1:50061")
    assert args.port == 6001
    assert args.engine == ["10.0.0.1:50061"]  # a repeatable flag replaces the file's list
    assert args.max_in_flight == 7
    assert args.config_sources == {"--max-in-flight": f"key 'max-in-flight' in {path}"}


def test_switches_and_negatable_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "batch-invariant = false\nallow_oversubscribe = true\nmax-num-seqs = 64\n")
    args = parse("engine", "--config", path)
    assert (args.batch_invariant, args.allow_oversubscribe, args.max_num_seqs) == (False, True, 64)
    assert parse("engine", "--config", path, "--batch-invariant").batch_invariant is True
    assert parse("serve", "--config", write(tmp_path, "batch-invariant = false\n", "s.toml")).batch_invariant is False


@pytest.mark.parametrize(
    ("command", "text", "sentence"),
    [
        ("gateway", "max-in-fligth = 3\n", "{path}: unknown key 'max-in-fligth': it is not a flag of dpgate gateway."),
        ("engine", "policy = 'round-robin'\n", "{path}: unknown key 'policy': it is not a flag of dpgate engine."),
        ("gateway", "config = 'other.toml'\n", "{path}: key 'config' is refused: a config file cannot name another."),
        ("gateway", "port = 'abc'\n", "{path}: key 'port': argument --port: invalid int value: 'abc'"),
        ("gateway", "port = true\n", "{path}: key 'port': argument --port: invalid int value: 'true'"),
        (
            "engine",
            "max_num_seqs = 1.5\n",
            "{path}: key 'max_num_seqs': argument --max-num-seqs: invalid int value: '1.5'",
        ),
        ("gateway", "policy = 'fastest'\n", "{path}: key 'policy': argument --policy: invalid choice: 'fastest'"),
        ("gateway", "port = [1, 2]\n", "{path}: key 'port' takes one value, not a list, as --port is not repeatable."),
        (
            "gateway",
            "log-json = 'yes'\n",
            "{path}: key 'log-json' must be true or false, as --log-json takes no value.",
        ),
        ("gateway", "[port]\nvalue = 1\n", "{path}: key 'port' must be a value, not a table."),
        ("gateway", "port = \n", "--config {path!r} is not valid TOML"),
    ],
)
def test_bad_keys_and_values_exit_2_with_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, text: str, sentence: str
) -> None:
    path = write(tmp_path, text)
    line = refused(capsys, command, "--config", path)
    expected = sentence.format(path=path)
    assert line.startswith(f"dpgate {command}: error: {expected}"), line


def test_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nowhere.toml")
    assert refused(capsys, "serve", "--config", missing) == (
        f"dpgate serve: error: --config {missing!r} cannot be read (No such file or directory)."
    )


@pytest.mark.parametrize(
    ("command", "text", "sentence"),
    [
        (
            "gateway",
            'engine = ["127.0.0.1:50061"]\nport = 70000\n',
            "dpgate gateway: error: --port 70000 must be in 0..65535 (0 picks a free port) "
            "(set by key 'port' in {path}).",
        ),
        (
            "gateway",
            'engine = ["127.0.0.1:50061"]\ndrain-grace = 40.0\n',
            "dpgate gateway: error: --drain-grace 40.0 must be shorter than --shutdown-timeout 30.0, or in-flight "
            "calls get no time to finish (set by key 'drain-grace' in {path}).",
        ),
        (
            "engine",
            "max-num-seqs = 0\n",
            "dpgate engine: --max-num-seqs 0 must be >= 1 (set by key 'max-num-seqs' in {path}).",
        ),
        (
            "serve",
            "data-parallel-size = 0\n",
            "dpgate serve: error: --data-parallel-size must be at least 1 (set by key 'data-parallel-size' in {path}).",
        ),
    ],
)
def test_a_rule_broken_by_the_file_names_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, text: str, sentence: str
) -> None:
    """The same validation as the flags (the command's own), attributed to the key."""
    path = write(tmp_path, text)
    assert main([command, "--config", path]) == 2
    assert capsys.readouterr().err.strip() == sentence.format(path=path)


def test_a_rule_broken_on_the_command_line_is_not_blamed_on_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, 'engine = ["127.0.0.1:50061"]\nport = 70000\n')
    assert main(["gateway", "--config", path, "--port", "70001"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "dpgate gateway: error: --port 70001 must be in 0..65535 (0 picks a free port)."
    )


def test_api_keys_from_the_environment_are_checked(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("DPGATE_API_KEYS", "   ")
    assert main(["gateway", "--engine", "127.0.0.1:50061"]) == 2
    assert capsys.readouterr().err.strip() == "dpgate gateway: error: DPGATE_API_KEYS is set but holds no key."
