"""The Actions workflow: trigger, guard, concurrency, pinned actions, default-branch checkout.

PyYAML parses it (YAML 1.1 reads the bare key ``on`` as boolean True, handled below).
"""

import re
from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "ci-commands.yml"
PINNED = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")


@pytest.fixture(scope="module")
def text() -> str:
    return WORKFLOW.read_text()


@pytest.fixture(scope="module")
def workflow(text: str) -> dict:
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def job(workflow: dict) -> dict:
    (only,) = workflow["jobs"].values()
    return only


def test_triggers_only_on_created_comments(workflow: dict) -> None:
    triggers = workflow.get("on", workflow.get(True))
    assert triggers == {"issue_comment": {"types": ["created"]}}


def test_runs_only_in_the_project_repository_and_only_for_pull_requests(job: dict) -> None:
    condition = job["if"]
    assert "github.repository == 'dpgate-project/dpgate'" in condition
    assert "github.event.issue.pull_request" in condition
    assert "&&" in condition and "||" not in condition


def test_one_command_at_a_time_per_pull_request(workflow: dict) -> None:
    concurrency = workflow["concurrency"]
    assert concurrency["group"] == "ci-commands-${{ github.event.issue.number }}"
    assert concurrency["cancel-in-progress"] is False
    assert concurrency["queue"] == "max"  # later commands wait instead of replacing the pending one


def test_permissions_are_minimal(workflow: dict, job: dict) -> None:
    assert workflow["permissions"] == {}
    assert job["permissions"] == {"contents": "read", "pull-requests": "write"}


def test_every_action_is_pinned_by_full_commit_sha(job: dict) -> None:
    uses = [step["uses"] for step in job["steps"] if "uses" in step]
    assert {u.split("@")[0] for u in uses} == {"actions/checkout", "actions/setup-python"}
    for reference in uses:
        assert PINNED.match(reference), reference


def test_checks_out_only_the_default_branch(job: dict, text: str) -> None:
    (checkout,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout["with"]["ref"] == "${{ github.event.repository.default_branch }}"
    assert checkout["with"]["persist-credentials"] is False
    for contributor_ref in ("pull_request.head", "head_ref", "head.sha", "refs/pull/"):
        assert contributor_ref not in text


def test_runs_the_module_on_the_event_without_interpolating_the_payload(job: dict) -> None:
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert runs == ['python -m ci_commands --event "$GITHUB_EVENT_PATH"']
    for step in job["steps"]:
        assert "${{" not in step.get("run", "")
        for value in step.get("env", {}).values():
            assert "github.event" not in value


def test_tokens_come_from_secrets(job: dict) -> None:
    (step,) = [s for s in job["steps"] if "run" in s]
    assert step["env"]["GITHUB_TOKEN"] == "${{ secrets.GITHUB_TOKEN }}"
    assert step["env"]["BUILDKITE_TOKEN"].startswith("${{ secrets.")
