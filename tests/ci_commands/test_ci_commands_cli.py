"""The command line as the workflow runs it: event file in, settings from flags or environment."""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from ci_fake_api import BUILDKITE_TOKEN, GITHUB_TOKEN, ORG, PIPELINE, FakeApi

from ci_commands.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def event_file(tmp_path: Path, comment_event: Callable[..., dict]) -> Callable[..., Path]:
    def write(body: str, login: str = "maint", comment_id: int = 9001) -> Path:
        path = tmp_path / f"event-{comment_id}.json"
        path.write_text(json.dumps(comment_event(body, login=login, comment_id=comment_id)))
        return path

    return write


def environment(api: FakeApi, **extra: str) -> dict[str, str]:
    return {
        "GITHUB_TOKEN": GITHUB_TOKEN,
        "BUILDKITE_TOKEN": BUILDKITE_TOKEN,
        "GITHUB_API_URL": api.github_url,
        "BUILDKITE_API_URL": api.buildkite_url,
        "BUILDKITE_ORGANIZATION": ORG,
        "BUILDKITE_PIPELINE": PIPELINE,
        **extra,
    }


def test_cancel_from_an_event_file_with_settings_from_the_environment(
    fake_api: FakeApi, event_file: Callable[..., Path]
) -> None:
    fake_api.add_pull(42)
    fake_api.add_build(1, "alice:feature-x", "running", pr=42)
    fake_api.permissions["maint"] = ("admin", "admin")
    assert main(["--event", str(event_file("/ci cancel"))], environment(fake_api)) == 0
    assert fake_api.cancelled_numbers() == [1]


def test_flags_override_the_environment(fake_api: FakeApi, event_file: Callable[..., Path]) -> None:
    fake_api.add_pull(42)
    fake_api.add_build(1, "alice:feature-x", "running", pr=42)
    env = environment(fake_api, GITHUB_API_URL="http://127.0.0.1:9/nowhere", BUILDKITE_PIPELINE="wrong")
    argv = ["--event", str(event_file("/ci cancel", login="Trusty")), "--github-api", fake_api.github_url]
    argv += ["--pipeline", PIPELINE, "--trusted-users", "someone, trusty"]
    assert main(argv, env) == 0
    assert fake_api.cancelled_numbers() == [1]


def test_trusted_users_from_the_environment(fake_api: FakeApi, event_file: Callable[..., Path]) -> None:
    fake_api.add_pull(42)
    env = environment(fake_api, CI_TRUSTED_USERS="carol,dave")
    assert main(["--event", str(event_file("/ci status", login="dave"))], env) == 0
    assert "was not run" not in fake_api.comments[0][1]


def test_refusal_exits_zero_and_buildkite_failure_exits_one(
    fake_api: FakeApi, event_file: Callable[..., Path]
) -> None:
    fake_api.add_pull(42)
    assert main(["--event", str(event_file("/ci status", login="stranger"))], environment(fake_api)) == 0
    fake_api.permissions["maint"] = ("write", "write")
    env = environment(fake_api, BUILDKITE_TOKEN="revoked")
    assert main(["--event", str(event_file("/ci status", comment_id=9002))], env) == 1


def test_missing_settings_are_named_and_exit_two(
    fake_api: FakeApi, event_file: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--event", str(event_file("/ci cancel"))], {}) == 2
    err = capsys.readouterr().err
    for name in ("GITHUB_TOKEN", "BUILDKITE_TOKEN", "--organization", "--pipeline"):
        assert name in err
    assert fake_api.calls == []


def test_serve_needs_a_webhook_secret(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--serve", "0"], environment(fake_api)) == 2
    assert "CI_COMMANDS_WEBHOOK_SECRET" in capsys.readouterr().err


@pytest.mark.e2e
def test_python_dash_m_runs_the_workflow_command(fake_api: FakeApi, event_file: Callable[..., Path]) -> None:
    fake_api.add_pull(42)
    fake_api.add_build(1, "alice:feature-x", "running", pr=42)
    fake_api.permissions["maint"] = ("write", "maintain")
    env = {"PATH": os.environ.get("PATH", ""), **environment(fake_api)}
    result = subprocess.run(
        [sys.executable, "-m", "ci_commands", "--event", str(event_file("/ci cancel"))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout
    assert fake_api.cancelled_numbers() == [1]


@pytest.mark.parametrize("content", ["not json", "[1]"], ids=["not-json", "not-object"])
def test_unusable_event_files_exit_two_without_api_calls(
    fake_api: FakeApi, tmp_path: Path, content: str
) -> None:
    path = tmp_path / "event.json"
    path.write_text(content)
    assert main(["--event", str(path)], environment(fake_api)) == 2
    assert fake_api.calls == []


def test_malformed_pull_request_comment_exits_two(fake_api: FakeApi, tmp_path: Path) -> None:
    path = tmp_path / "event.json"
    path.write_text(json.dumps({"action": "created", "issue": {"number": 1, "pull_request": {"url": "u"}}}))
    assert main(["--event", str(path)], environment(fake_api)) == 2
    assert fake_api.calls == []


def test_missing_event_file_exits_two(fake_api: FakeApi, tmp_path: Path) -> None:
    assert main(["--event", str(tmp_path / "absent.json")], environment(fake_api)) == 2
