"""The rules of the Actions workflows (.github/workflows/): pinned actions, where the BSR token may
appear, triggers and labels of the schema workflow, and what CI runs.

PyYAML parses each workflow (YAML 1.1 reads the bare key ``on`` as boolean True, handled below);
version comments are not part of the parsed document, so pins are checked on the text as well.
Each rule is a small function returning its violations, tested here on the real files and on
workflows that break it, so a rule that stopped looking would fail.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
REPOSITORY_GUARD = "github.repository == 'dpgate-project/dpgate'"
NOT_A_PULL_REQUEST = "github.event_name != 'pull_request'"
TOKEN = "secrets.BUF_TOKEN"
USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>\S+)(?P<rest>.*)$")
PINNED_WITH_VERSION = re.compile(r"^[\w.-]+/[\w.-]+(?:/[\w./-]+)?@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"^\s+#\s+v\d+(?:\.\d+){0,2}\s*$")


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    return workflow.get("on", workflow.get(True))


def all_uses(node: Any) -> list[str]:
    """Every `uses:` value anywhere in a parsed workflow."""
    if isinstance(node, dict):
        found = [node["uses"]] if isinstance(node.get("uses"), str) else []
        return found + [u for value in node.values() for u in all_uses(value)]
    if isinstance(node, list):
        return [u for item in node for u in all_uses(item)]
    return []


def unpinned_uses(text: str) -> list[str]:
    """`uses:` lines not pinned to a full commit SHA followed by a `# vX.Y.Z` comment."""
    bad = []
    for line in text.splitlines():
        match = USES_LINE.match(line)
        if match is None:
            continue
        if not (PINNED_WITH_VERSION.match(match["ref"]) and VERSION_COMMENT.match(match["rest"])):
            bad.append(line.strip())
    return bad


def is_guarded(condition: str) -> bool:
    """Both the repository and the non-PR condition, joined only by && (an || could bypass them)."""
    return REPOSITORY_GUARD in condition and NOT_A_PULL_REQUEST in condition and "||" not in condition


def token_violations(workflow: dict[str, Any]) -> list[str]:
    """Places the token appears outside a step whose job (or the step itself) is guarded."""
    bad = []
    outside_steps = {k: v for k, v in workflow.items() if k != "jobs"}
    if TOKEN in json.dumps(outside_steps, default=str):
        bad.append("workflow level")
    for job_name, job in workflow.get("jobs", {}).items():
        if TOKEN in json.dumps({k: v for k, v in job.items() if k != "steps"}):
            bad.append(f"job {job_name} outside its steps")
        for index, step in enumerate(job.get("steps", [])):
            if TOKEN in json.dumps(step) and not (
                is_guarded(str(job.get("if", ""))) or is_guarded(str(step.get("if", "")))
            ):
                bad.append(f"job {job_name} step {index}")
    return bad


def steps_running(job: dict[str, Any], command: str) -> list[dict[str, Any]]:
    return [step for step in job["steps"] if command in step.get("run", "")]


WORKFLOW_FILES = sorted(path.name for path in WORKFLOWS.glob("*.yml"))


def test_the_workflows_this_file_knows_are_there() -> None:
    assert {"buf.yml", "ci.yml", "ci-commands.yml"} <= set(WORKFLOW_FILES)


@pytest.mark.parametrize("name", WORKFLOW_FILES)
def test_every_action_is_pinned_by_commit_with_its_version(name: str) -> None:
    text = (WORKFLOWS / name).read_text()
    assert unpinned_uses(text) == []
    # The line check saw every `uses:` the parser sees (none written in a flow style it would miss).
    assert len([line for line in text.splitlines() if USES_LINE.match(line)]) == len(all_uses(yaml.safe_load(text)))


@pytest.mark.parametrize("name", WORKFLOW_FILES)
def test_the_bsr_token_appears_only_behind_the_guard(name: str) -> None:
    assert token_violations(load(name)) == []


def test_every_repository_guard_names_the_same_repository() -> None:
    guards = set()
    for name in WORKFLOW_FILES:
        guards |= set(re.findall(r"github\.repository == '([^']+)'", (WORKFLOWS / name).read_text()))
    assert guards == {"dpgate-project/dpgate"}


@pytest.mark.parametrize(
    ("line", "pinned"),
    [
        ("      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1", True),
        ("      - uses: actions/checkout@v7", False),
        ("      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1", False),
        ("      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b # v7.0.1", False),
        ("        uses: actions/checkout@main # v7.0.1", False),
    ],
)
def test_the_pin_rule_tells_pinned_from_unpinned(line: str, pinned: bool) -> None:
    assert (unpinned_uses(line) == []) is pinned


def test_the_token_rule_catches_an_unguarded_or_bypassable_step() -> None:
    login = {"uses": "bufbuild/buf-action@x", "with": {"token": "${{ secrets.BUF_TOKEN }}"}}
    guarded = f"{REPOSITORY_GUARD} && {NOT_A_PULL_REQUEST}"
    assert token_violations({"jobs": {"push": {"if": guarded, "steps": [login]}}}) == []
    assert token_violations({"jobs": {"push": {"steps": [{**login, "if": guarded}]}}}) == []
    assert token_violations({"jobs": {"push": {"if": REPOSITORY_GUARD, "steps": [login]}}}) == ["job push step 0"]
    assert token_violations({"jobs": {"push": {"if": f"{guarded} || true", "steps": [login]}}}) == ["job push step 0"]
    assert token_violations({"env": {"T": "${{ secrets.BUF_TOKEN }}"}, "jobs": {}}) == ["workflow level"]
    assert token_violations({"jobs": {"push": {"if": guarded, "env": {"T": TOKEN}, "steps": []}}}) == [
        "job push outside its steps"
    ]


# --- buf.yml: the schema workflow --------------------------------------------------------------


@pytest.fixture(scope="module")
def buf() -> dict[str, Any]:
    return load("buf.yml")


def test_buf_triggers(buf: dict[str, Any]) -> None:
    on = triggers(buf)
    assert set(on) == {"pull_request", "schedule", "workflow_dispatch", "push"}
    assert set(on["pull_request"]["paths"]) >= {"proto/**", "buf.yaml", "buf.gen.yaml"}
    assert len(on["schedule"]) == 1 and len(on["schedule"][0]["cron"].split()) == 5
    assert on["schedule"][0]["cron"].split()[2:] == ["*", "*", "*"]  # every day
    assert on["push"] == {"tags": ["v*"]}  # tags only: a branch push publishes nothing


def test_pull_requests_lint_build_format_and_check_breaking_without_the_token(buf: dict[str, Any]) -> None:
    (check,) = [job for job in buf["jobs"].values() if job.get("if") == "github.event_name == 'pull_request'"]
    assert TOKEN not in json.dumps(check)
    assert steps_running(check, "buf lint") and steps_running(check, "buf build")
    assert steps_running(check, "buf format --diff --exit-code")
    (breaking,) = steps_running(check, "buf breaking")
    assert '--against ".git#ref=${BASE_SHA}"' in breaking["run"]
    assert breaking["env"] == {"BASE_SHA": "${{ github.event.pull_request.base.sha }}"}
    (checkout,) = [s for s in check["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout["with"]["fetch-depth"] == 0  # the base commit is in the clone


def test_pushes_are_labelled_nightly_on_schedule_and_main_plus_tag_on_tags(buf: dict[str, Any]) -> None:
    push = buf["jobs"]["push"]
    assert is_guarded(push["if"])
    pushes = steps_running(push, "buf push")
    labels = {step["if"]: re.findall(r"--label (\S+)", step["run"]) for step in pushes}
    assert labels == {
        "github.event_name == 'schedule' || github.event_name == 'workflow_dispatch'": ["nightly"],
        "github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v')": ["main", '"${TAG}"'],
    }
    (release,) = [step for step in pushes if "TAG" in step.get("env", {})]
    assert release["env"]["TAG"] == "${{ github.ref_name }}"
    for step in pushes:
        assert "--git-metadata" not in step["run"]  # it would add every branch at the commit as a label


def test_the_buf_cli_is_the_version_package_json_pins(buf: dict[str, Any]) -> None:
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["@bufbuild/buf"]
    setups = [
        step for job in buf["jobs"].values() for step in job["steps"] if "bufbuild/buf-action@" in step.get("uses", "")
    ]
    assert len(setups) == len(buf["jobs"])
    for step in setups:
        assert step["with"]["version"] == pinned
        assert step["with"]["setup_only"] is True  # every buf command is spelled out in the workflow


def test_the_module_readme_documents_the_labels() -> None:
    module = yaml.safe_load((ROOT / "buf.yaml").read_text())["modules"][0]
    readme = (ROOT / module["path"] / "README.md").read_text()
    for label in ("`nightly`", "`main`", "`v"):
        assert label in readme
    assert module["name"] in readme


# --- ci.yml ------------------------------------------------------------------------------------


def test_ci_runs_the_repository_checks_on_pull_requests_and_main() -> None:
    ci = load("ci.yml")
    assert triggers(ci) == {"pull_request": None, "push": {"branches": ["main"]}}
    (job,) = ci["jobs"].values()
    assert [step["run"] for step in job["steps"] if "run" in step] == [".ci/run"]
    (python,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@")]
    assert python["with"]["python-version"] == "3.11"
    assert any(s.get("uses", "").startswith("actions/setup-node@") for s in job["steps"])
    assert "${{ secrets." not in (WORKFLOWS / "ci.yml").read_text()
