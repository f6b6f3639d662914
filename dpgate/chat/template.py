"""A model's chat template: what it does by default, and the prompt it makes of a conversation.

The template's text comes from the engine (the model's own, from GGUF metadata or tokenizer files,
or `--chat-template FILE`), and so do its special-token variables (`bos_token`, `eos_token`, ...);
rendering runs in dpgate/chat/jinja_env.py. The gateway builds the same `ChatTemplate` from what
GetTokenizer hands it, so both render one conversation into one prompt.

Thinking is resolved once (dpgate/chat/thinking.py) and the same value is handed to the template
as both `thinking` and `enable_thinking`, and to the output parser, so the prompt and the parser's
starting state always agree. A template that never mentions `tools` (SmolLM2's) would drop the
tool definitions silently; for it the tools go into a Hermes-style system block instead, and
earlier tool calls and tool results are written as the same markup, so the model sees them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from dpgate.chat.jinja_env import render_template
from dpgate.chat.markers import ChatMarkers
from dpgate.chat.thinking import resolve_thinking
from dpgate.invalid_request import InvalidRequestError

NO_TEMPLATE_MESSAGE = "the model has no chat template; pass one with --chat-template FILE"
_THINKING_KEYS = ("thinking", "enable_thinking")


class NoChatTemplateError(LookupError):
    """The model has no chat template and none was given (FAILED_PRECONDITION)."""

    def __init__(self) -> None:
        super().__init__(NO_TEMPLATE_MESSAGE)


class ChatTemplateError(InvalidRequestError):
    """The template failed to render this conversation (INVALID_ARGUMENT: the template's own rule)."""


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    text: str
    thinking: bool  # the resolved value the template was given; the parser starts from it


def read_template_file(path: str) -> str:
    """The text of a `--chat-template FILE`; a Jinja file, or a JSON string / tokenizer_config-like object."""
    text = Path(path).read_text(encoding="utf-8")
    stripped = text.strip()
    if stripped.startswith(("{", '"')) and not stripped.startswith(("{%", "{{", "{#")):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            return text
        if isinstance(value, str):
            return value
        if isinstance(value, dict) and isinstance(value.get("chat_template"), str):
            return value["chat_template"]
    return text


class ChatTemplate:
    """One model's chat template and what it does by default.

    `special_tokens`: the tokenizer's special tokens by role (`bos_token`, `eos_token`, ...), the
    variables a template writes them with. `supports_thinking`: the template reads a thinking
    switch or writes the reasoning marker, so the reasoning parser has something to parse.
    `thinking_default`: what it does when neither key is given, found by rendering (the default
    render equals the thinking-on render and not the thinking-off one). `handles_tools`: the
    template reads `tools` itself.
    """

    def __init__(self, source: str, markers: ChatMarkers, special_tokens: Mapping[str, str] | None = None) -> None:
        self.source = source
        self.markers = markers
        self.special_tokens = dict(special_tokens or {})
        self.handles_tools = "tools" in source
        self.supports_thinking = any(key in source for key in _THINKING_KEYS) or markers.reasoning_start in source
        self.thinking_default = self._detect_thinking_default() if self.supports_thinking else False

    @classmethod
    def from_source(
        cls, source: Any, markers: ChatMarkers, special_tokens: Mapping[str, str] | None = None
    ) -> ChatTemplate:
        """A template from its text as a tokenizer holds it (a string, or several named templates of
        which "default" is used); NoChatTemplateError when there is none."""
        if isinstance(source, dict):
            source = source.get("default")
        if not isinstance(source, str) or not source.strip():
            raise NoChatTemplateError()
        return cls(source, markers, special_tokens)

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: Mapping[str, Any] | None
    ) -> RenderedPrompt:
        # Resolved even when the template cannot think, so a malformed switch is refused either way.
        thinking = resolve_thinking(kwargs, self.thinking_default) and self.supports_thinking
        variables = dict(kwargs or {})
        variables.update({key: thinking for key in _THINKING_KEYS})
        if tools and not self.handles_tools:
            messages = _with_tool_system_block(messages, tools, self.markers)
        if not self.handles_tools:
            messages = [_as_plain_message(message, self.markers) for message in messages]
        text = self._apply(messages, tools if tools and self.handles_tools else None, variables)
        return RenderedPrompt(text, thinking)

    def _apply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, variables: dict) -> str:
        try:
            return render_template(self.source, messages, tools, {**self.special_tokens, **variables})
        except (TemplateError, TypeError, ValueError, KeyError) as error:  # raise_exception() or a Jinja error
            raise ChatTemplateError(f"the chat template refused the conversation: {error}") from error

    def _detect_thinking_default(self) -> bool:
        """On when the default prompt leaves reasoning open (DeepSeek-R1, our test templates), or
        when it equals the thinking-on prompt but not the thinking-off one (Qwen3: the model opens
        `<think>` itself unless the template closed an empty block)."""
        probe = [{"role": "user", "content": "ping"}]
        try:
            default = self._apply(probe, None, {})
            on = self._apply(probe, None, dict.fromkeys(_THINKING_KEYS, True))
            off = self._apply(probe, None, dict.fromkeys(_THINKING_KEYS, False))
        except ChatTemplateError:
            return False
        if default.rfind(self.markers.reasoning_start) > default.rfind(self.markers.reasoning_end):
            return True
        return default == on != off


def _tool_system_block(tools: list[dict[str, Any]], markers: ChatMarkers) -> str:
    """The Hermes function-calling system prompt (what SmolLM2 and Qwen were trained on)."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "You are a function calling AI model. You are provided with function signatures within <tools></tools> "
        "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions "
        "about what values to plug into functions.\n"
        f"<tools>\n{listed}\n</tools>\n"
        "For each function call, return a json object with function name and arguments within "
        f"{markers.tool_call_start}{markers.tool_call_end} XML tags:\n"
        f'{markers.tool_call_start}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
        f"{markers.tool_call_end}"
    )


def _with_tool_system_block(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], markers: ChatMarkers
) -> list[dict[str, Any]]:
    block = _tool_system_block(tools, markers)
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{block}" if first["content"] else block
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def _as_plain_message(message: dict[str, Any], markers: ChatMarkers) -> dict[str, Any]:
    """A message a tools-unaware template can render: tool calls and results written as Hermes markup."""
    role = message["role"]
    if role == "assistant" and message.get("tool_calls"):
        calls = "\n".join(
            f"{markers.tool_call_start}\n"
            + json.dumps({"name": call["function"]["name"], "arguments": call["function"]["arguments"]})
            + f"\n{markers.tool_call_end}"
            for call in message["tool_calls"]
        )
        content = f"{message['content']}\n{calls}" if message["content"] else calls
        return {"role": "assistant", "content": content}
    if role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
    return {"role": role, "content": message["content"]}
