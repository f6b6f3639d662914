"""Reply wording that the end-to-end tests do not reach: empty lists and truncated listings."""

from ci_commands import replies
from ci_commands.actions import CancelReport, RetryReport, Skipped, StatusReport
from ci_commands.authorize import Reason
from ci_commands.buildkite import Build
from ci_commands.commands import Command
from ci_commands.ownership import Verdict

BUILD = Build(7, "running", "alice:x", "0123456789abcdef", "", "42", {})


def test_empty_cancel_says_nothing_was_found() -> None:
    text = replies.cancelled(Command.CANCEL, "m", CancelReport((), (), (), truncated=False))
    assert "no scheduled, running or failing builds" in text
    assert replies.TRUNCATED_NOTE not in text


def test_truncated_listings_are_flagged() -> None:
    report = CancelReport((BUILD,), (Skipped(BUILD, Verdict.OTHER_PR),), (), truncated=True)
    text = replies.cancelled(Command.CANCEL, "m", report)
    assert text.endswith(replies.TRUNCATED_NOTE)
    assert "- cancelled: #7" in text and "skipped #7 (alice:x, running): does not belong" in text
    assert replies.status(Command.STATUS, "m", StatusReport((BUILD,), True)).endswith(replies.TRUNCATED_NOTE)


def test_status_line_shows_state_branch_and_short_commit() -> None:
    text = replies.status(Command.STATUS, "m", StatusReport((BUILD,), False))
    assert text.splitlines()[1] == "- #7 running on `alice:x` at 0123456789ab"


def test_refusal_names_command_person_and_reason() -> None:
    text = replies.refusal(Command.RUN, "bob", Reason.DRAFT)
    assert text == f"`/ci run` (requested by @bob) was not run: {Reason.DRAFT.value}."


def test_retry_without_original() -> None:
    assert "no failed build" in replies.retried(Command.RETRY, "m", RetryReport(None, None))
