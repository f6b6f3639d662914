"""Whether a chat request thinks: one rule, read by the prompt renderer and the output parser alike.

Both sides must agree, or the parser starts in reasoning while the prompt never opened it (or the
reverse) and the answer lands in the wrong field. So the decision is made once, here, from the
request's `chat_template_kwargs`, and both receive the same bool.

The rule, over the keys `thinking` and `enable_thinking` (each absent, true, false or null):
- either key true -> on (OR: `thinking: true, enable_thinking: false` is on);
- neither true, but at least one given as false or null -> off (an explicit false or null opts out);
- both absent -> the template's own default;
- then `reasoning_effort == "none"` (that exact string; "None" is not it) turns it off whatever the
  keys said. Any other reasoning_effort ("low", "high", null, absent) changes nothing here; the
  template still receives it.
A value of another JSON type for one of these keys is refused with `ThinkingKwargError`, naming
the key: guessing what `"yes"` or `1` means would make the renderer and a template disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpgate.invalid_request import InvalidRequestError
from dpgate.json_text import json_type_name

THINKING_KEYS = ("thinking", "enable_thinking")
REASONING_EFFORT_KEY = "reasoning_effort"
REASONING_EFFORT_OFF = "none"
FIELD = "chat_template_kwargs"


class ThinkingKwargError(InvalidRequestError):
    """A thinking switch in chat_template_kwargs has a value the rule cannot read (INVALID_ARGUMENT)."""


def resolve_thinking(kwargs: Mapping[str, Any] | None, template_default: bool) -> bool:
    """True when the request thinks. `kwargs` is chat_template_kwargs as plain data (a Struct's
    null is None, an absent key is absent); None means no kwargs at all."""
    kwargs = kwargs or {}
    given = {key: kwargs[key] for key in THINKING_KEYS if key in kwargs}
    for key, value in given.items():
        if value is not None and not isinstance(value, bool):
            raise ThinkingKwargError(f"{FIELD}.{key} must be true, false or null, not {json_type_name(value)}")
    effort = kwargs.get(REASONING_EFFORT_KEY)
    if effort is not None and not isinstance(effort, str):
        raise ThinkingKwargError(
            f"{FIELD}.{REASONING_EFFORT_KEY} must be a string or null, not {json_type_name(effort)}"
        )
    if effort == REASONING_EFFORT_OFF:
        return False
    if any(value is True for value in given.values()):
        return True
    if given:
        return False  # false or null, and nothing true: an explicit opt-out
    return template_default
