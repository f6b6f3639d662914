"""De-duplication by the bot's reaction: 201 claims, 200 means an earlier delivery claimed."""

import pytest
from ci_fake_api import GITHUB_TOKEN, REPO, FakeApi

from ci_commands.dedupe import CLAIM_REACTION, Claim, claim_comment, claim_from_status
from ci_commands.github import GitHubClient


@pytest.mark.parametrize(("status", "claim"), [(201, Claim.FIRST), (200, Claim.DUPLICATE)])
def test_claim_from_status(status: int, claim: Claim) -> None:
    assert claim_from_status(status) is claim


@pytest.mark.parametrize("status", [202, 204, 299])
def test_unexpected_success_status_is_not_guessed(status: int) -> None:
    with pytest.raises(ValueError):
        claim_from_status(status)


def test_second_claim_of_a_comment_is_a_duplicate_but_other_comments_are_not(fake_api: FakeApi) -> None:
    github = GitHubClient.create(GITHUB_TOKEN, fake_api.github_url)
    assert claim_comment(github, REPO, 1) is Claim.FIRST
    assert claim_comment(github, REPO, 1) is Claim.DUPLICATE
    assert claim_comment(github, REPO, 2) is Claim.FIRST
    assert {c.body["content"] for c in fake_api.calls} == {CLAIM_REACTION}
