"""Payload parsing keeps identifiers only and ignores everything that is not a new PR comment."""

import copy

import pytest

from ci_commands.event import CommentEvent, EventError, parse_event

PAYLOAD = {
    "action": "created",
    "issue": {"number": 42, "pull_request": {"url": "https://api.github.com/repos/o/r/pulls/42"}},
    "comment": {"id": 9001, "body": "/ci cancel", "user": {"login": "alice"}, "author_association": "OWNER"},
    "repository": {"full_name": "dpgate-project/dpgate"},
}


def variant(**changes: object) -> dict:
    payload = copy.deepcopy(PAYLOAD)
    for path, value in changes.items():
        node = payload
        *parents, leaf = path.split("__")
        for key in parents:
            node = node[key]
        if value is KeyError:
            del node[leaf]
        else:
            node[leaf] = value
    return payload


def test_created_pr_comment_is_parsed() -> None:
    assert parse_event(PAYLOAD) == CommentEvent(
        repository="dpgate-project/dpgate",
        pr_number=42,
        comment_id=9001,
        commenter="alice",
        body="/ci cancel",
    )


@pytest.mark.parametrize(
    "payload",
    [
        variant(action="edited"),
        variant(action="deleted"),
        variant(action=KeyError),
        variant(issue__pull_request=KeyError),
        variant(issue__pull_request=None),
        variant(issue="not an object"),
    ],
    ids=["edited", "deleted", "no-action", "plain-issue", "null-pull-request", "bad-issue"],
)
def test_non_pr_or_non_created_events_are_ignored(payload: dict) -> None:
    assert parse_event(payload) is None


@pytest.mark.parametrize(
    "payload",
    [
        variant(comment__user=KeyError),
        variant(comment__user__login=""),
        variant(repository__full_name="no-slash"),
        variant(issue__number="42"),
        variant(issue__number=True),
        variant(comment__id=None),
        variant(comment=KeyError),
    ],
    ids=["no-user", "empty-login", "bad-repo", "string-number", "bool-number", "no-comment-id", "no-comment"],
)
def test_malformed_pr_comment_is_an_error(payload: dict) -> None:
    with pytest.raises(EventError):
        parse_event(payload)


def test_null_body_is_empty_text_not_a_crash() -> None:
    event = parse_event(variant(comment__body=None))
    assert event is not None and event.body == ""
