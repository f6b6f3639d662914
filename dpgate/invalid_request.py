"""The error a request gets when one of its fields breaks a rule, shared by every reader of a request.

The engine turns it into INVALID_ARGUMENT with its message, which names the field and the rule. It
lives on the floor because the chat rendering both the engine and the gateway run (dpgate/chat/)
validates what it renders; `engines.sampling.params` re-exports it under its old name.
"""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request field breaks a rule; the message names the field and the rule."""


def require(condition: bool, message: str) -> None:
    """Refuse the request with `message` unless `condition` holds."""
    if not condition:
        raise InvalidRequestError(message)
