"""resolve_thinking: the one rule the renderer and the parser share (dpgate/chat/thinking.py)."""

from __future__ import annotations

import itertools

import pytest

from dpgate.chat.thinking import ThinkingKwargError, resolve_thinking
from engines.sampling.params import InvalidRequestError

ABSENT = object()
SWITCH_VALUES = (ABSENT, True, False, None)
EFFORT_VALUES = (ABSENT, "none", "None", None, "low", "high")


def kwargs_of(thinking, enable_thinking, effort) -> dict:
    given = {"thinking": thinking, "enable_thinking": enable_thinking, "reasoning_effort": effort}
    return {key: value for key, value in given.items() if value is not ABSENT}


def expected(thinking, enable_thinking, effort, template_default: bool) -> bool:
    """The rule written out independently of the implementation."""
    if effort == "none":
        return False
    if thinking is True or enable_thinking is True:
        return True
    if thinking is ABSENT and enable_thinking is ABSENT:
        return template_default
    return False


@pytest.mark.parametrize("template_default", [True, False])
@pytest.mark.parametrize(
    "thinking, enable_thinking, effort", list(itertools.product(SWITCH_VALUES, SWITCH_VALUES, EFFORT_VALUES))
)
def test_every_combination_follows_the_rule(thinking, enable_thinking, effort, template_default):
    kwargs = kwargs_of(thinking, enable_thinking, effort)
    assert resolve_thinking(kwargs, template_default) is expected(thinking, enable_thinking, effort, template_default)


@pytest.mark.parametrize("template_default", [True, False])
def test_no_kwargs_at_all_is_the_templates_default(template_default):
    assert resolve_thinking(None, template_default) is template_default
    assert resolve_thinking({}, template_default) is template_default
    assert resolve_thinking({"unrelated": 1}, template_default) is template_default


def test_either_key_true_is_on_even_beside_an_explicit_false():
    assert resolve_thinking({"thinking": True, "enable_thinking": False}, False) is True
    assert resolve_thinking({"thinking": False, "enable_thinking": True}, False) is True
    assert resolve_thinking({"thinking": None, "enable_thinking": True}, False) is True


def test_an_explicit_false_or_null_opts_out_of_a_default_on():
    assert resolve_thinking({"thinking": False}, True) is False
    assert resolve_thinking({"enable_thinking": None}, True) is False
    assert resolve_thinking({"thinking": None, "enable_thinking": None}, True) is False


def test_reasoning_effort_none_is_the_exact_lowercase_string():
    assert resolve_thinking({"thinking": True, "reasoning_effort": "none"}, True) is False
    assert resolve_thinking({"thinking": True, "reasoning_effort": "None"}, True) is True
    assert resolve_thinking({"thinking": True, "reasoning_effort": "NONE"}, True) is True
    assert resolve_thinking({"thinking": True, "reasoning_effort": " none"}, True) is True
    assert resolve_thinking({"reasoning_effort": "none"}, True) is False
    assert resolve_thinking({"reasoning_effort": None}, True) is True
    assert resolve_thinking({"reasoning_effort": "low"}, False) is False


@pytest.mark.parametrize(
    "value, json_type",
    [
        ("yes", "a string"),
        ("true", "a string"),
        (1, "a number"),
        (1.0, "a number"),
        (0, "a number"),
        ({}, "an object"),
        ([True], "an array"),
    ],
)
@pytest.mark.parametrize("key", ["thinking", "enable_thinking"])
def test_a_value_that_is_not_a_boolean_or_null_is_refused_naming_the_key(key, value, json_type):
    with pytest.raises(ThinkingKwargError) as raised:
        resolve_thinking({key: value}, True)
    message = str(raised.value)
    assert message == f"chat_template_kwargs.{key} must be true, false or null, not {json_type}"
    assert isinstance(raised.value, InvalidRequestError)  # the servicer's table maps it to INVALID_ARGUMENT
    assert not {"str", "int", "float", "dict", "list"} & set(message.replace(",", " ").split())


def test_a_bad_value_is_refused_even_when_the_other_key_is_true():
    with pytest.raises(ThinkingKwargError, match=r"chat_template_kwargs\.enable_thinking"):
        resolve_thinking({"thinking": True, "enable_thinking": "no"}, True)


@pytest.mark.parametrize("value, json_type", [(1, "a number"), (True, "a boolean"), ({}, "an object")])
def test_a_reasoning_effort_that_is_not_a_string_or_null_is_refused(value, json_type):
    with pytest.raises(ThinkingKwargError) as raised:
        resolve_thinking({"reasoning_effort": value}, True)
    assert str(raised.value) == f"chat_template_kwargs.reasoning_effort must be a string or null, not {json_type}"
