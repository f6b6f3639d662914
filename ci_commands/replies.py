"""Text of the comments posted back on the pull request; pure so wording is tested cheaply.

Each reply names the command and the person who asked, so a thread with several commands
stays readable, and lists builds with links so maintainers can check what was touched.
"""

from __future__ import annotations

from ci_commands.actions import CancelReport, RetryReport, StatusReport
from ci_commands.authorize import Reason
from ci_commands.buildkite import Build
from ci_commands.commands import Command

TRUNCATED_NOTE = "Note: the build list was longer than the page cap; run the command again for the rest."


def _link(build: Build) -> str:
    return f"[#{build.number}]({build.web_url})" if build.web_url else f"#{build.number}"


def _head(command: Command, login: str) -> str:
    return f"`{command.value}` (requested by @{login})"


def refusal(command: Command, login: str, reason: Reason) -> str:
    return f"{_head(command, login)} was not run: {reason.value}."


def closed(command: Command, login: str) -> str:
    return f"{_head(command, login)} was not run: the pull request is not open."


def failure(command: Command, login: str, detail: str) -> str:
    return f"{_head(command, login)} failed: {detail}. Nothing further was attempted."


def cancelled(command: Command, login: str, report: CancelReport) -> str:
    lines = [f"{_head(command, login)}:"]
    if not (report.cancelled or report.skipped or report.failed):
        lines.append("- no scheduled, running or failing builds of this pull request.")
    if report.cancelled:
        lines.append("- cancelled: " + ", ".join(_link(b) for b in report.cancelled))
    for item in report.skipped:
        lines.append(
            f"- skipped {_link(item.build)} ({item.build.branch}, {item.build.state}): {item.verdict.value}"
        )
    for item in report.failed:
        lines.append(f"- failed to cancel {_link(item.build)}: {item.error}")
    if report.truncated:
        lines.append(TRUNCATED_NOTE)
    return "\n".join(lines)


def status(command: Command, login: str, report: StatusReport) -> str:
    lines = [f"{_head(command, login)}:"]
    if not report.builds:
        lines.append("- no scheduled, running or failing builds of this pull request.")
    for build in report.builds:
        lines.append(f"- {_link(build)} {build.state} on `{build.branch}` at {build.commit[:12]}")
    if report.truncated:
        lines.append(TRUNCATED_NOTE)
    return "\n".join(lines)


def started(command: Command, login: str, build: Build) -> str:
    return f"{_head(command, login)}: started build {_link(build)} of {build.commit[:12]}."


def retried(command: Command, login: str, report: RetryReport) -> str:
    if report.original is None or report.rebuilt is None:
        return f"{_head(command, login)}: no failed build of this pull request to retry."
    return f"{_head(command, login)}: rebuilding {_link(report.original)} as {_link(report.rebuilt)}."
