"""Turns a wire ChatRequest / ChatStreamRequest into the `Sequence` the engine runs, and what the
output parser needs to read its output.

Every rule a chat client can break is checked here: messages, tools, tool_choice and the template
kwargs. The generation fields then go through the very code Generate uses (`assemble_sequence`,
with the rendered prompt's token ids), so sampling, stopping, logprobs and structured output mean
exactly what they mean for Generate. The prompt is tokenized without
adding special tokens: the template already wrote them. A tool_choice of REQUIRED or a named tool
becomes the request's grammar (engines/chat/tool_grammar.py), so the call parses and its
arguments follow the tool's schema.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, struct_pb2

from dpgate.chat.template import ChatTemplate
from dpgate.chat.tools import ToolSpec, parse_tools
from dpgate.json_text import strict_json_loads
from dpgate.v1 import generate_pb2
from engines.chat.markers import ChatParsing
from engines.sampling.params import InvalidRequestError, require
from engines.scheduling.detokenizer import Decoder
from engines.scheduling.sequence import Sequence
from engines.serving.request_builder import (
    ChatLike,
    ModelLimits,
    assemble_sequence,
    check_model,
    require_tokenizable,
)

_ROLES = {
    generate_pb2.CHAT_ROLE_SYSTEM: "system",
    generate_pb2.CHAT_ROLE_USER: "user",
    generate_pb2.CHAT_ROLE_ASSISTANT: "assistant",
    generate_pb2.CHAT_ROLE_TOOL: "tool",
}
# Names apply_chat_template takes itself; a kwarg of the same name would clash with them.
_RESERVED_KWARGS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


class ToolCallsOffError(RuntimeError):
    """The request must call a tool but the engine does not parse tool calls (FAILED_PRECONDITION)."""


@dataclass(slots=True)
class ChatRun:
    """A validated chat request: the sequence to run and how to read what it generates."""

    sequence: Sequence
    thinking: bool  # the value the template rendered with; the parser starts from it
    parsing: ChatParsing  # the model's parsers, with parse_tools off when this request may not call tools
    max_tool_calls: int | None = None  # 1 with parallel_tool_calls false; None: no limit


def run_here(function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Grammar work run in the calling thread (tests, tools); the server passes the grammar
    compiler's budgeted child processes instead."""
    return function(*args)


def build_chat(
    request: ChatLike,
    limits: ModelLimits,
    tokenizer: Decoder,
    template: ChatTemplate,
    parsing: ChatParsing,
    tenant: str = "",
    grammar_work: Callable[[Callable[..., Any], tuple[Any, ...]], Any] = run_here,
) -> ChatRun:
    """Validate and render a chat request into a sequence. Runs off the event loop (it tokenizes
    and may build a tool-call grammar); `grammar_work` runs the xgrammar conversion, which for a
    deeply nested tool schema takes as long as a compile, within the compile budget. `tenant`: the
    gateway's x-dpgate-tenant (with cache_salt, the prefix cache's extra keys)."""
    check_model(request.model, limits)
    messages = [_message(index, message) for index, message in enumerate(request.messages)]
    require(bool(messages), "messages must hold at least one message")
    tools = parse_tools(request.tools)
    choice = _tool_choice(request, tools)
    constrained = choice == "required" or choice.startswith("name:")
    require(
        not (constrained and request.HasField("structured_output")),
        "structured_output cannot be given with a tool_choice of REQUIRED or a named tool, which constrain "
        "the output themselves",
    )
    kwargs = _kwargs(request)
    wire_tools = [tool.as_template_tool() for tool in tools]
    rendered = template.render(messages, wire_tools or None, kwargs)
    require_tokenizable(rendered.text, limits, "messages")
    prompt_ids = list(tokenizer(rendered.text, add_special_tokens=False).input_ids)
    require(bool(prompt_ids), "messages must render to a prompt of at least one token")
    # Chat's default max_tokens is the rest of the context window, as OpenAI's and vLLM's chat is:
    # Generate's 16 would cut a tool call or an answer off mid-sentence.
    sequence = assemble_sequence(request, prompt_ids, limits, tokenizer, tenant, default_max_tokens=None)
    if constrained and not parsing.parse_tools:
        raise ToolCallsOffError(
            "tool_choice REQUIRED or a named tool needs tool-call parsing, which this engine has off "
            "(--tool-call-parser none)"
        )
    if constrained:
        from engines.chat.tool_grammar import tool_call_grammar  # imports xgrammar (2 s): not at start-up

        choice_name = choice.removeprefix("name:")
        sequence.grammar_spec = grammar_work(
            tool_call_grammar, (tools, choice_name, parsing.markers, rendered.thinking, _parallel(request))
        )
        require(
            bool(sequence.stop_token_ids),
            "tool_choice REQUIRED or a named tool needs a token that ends the output: with stopping.ignore_eos "
            "the model's eos tokens do not, so give stopping.stop_token_ids too",
        )
    may_call = bool(tools) and choice != "none"
    request_parsing = ChatParsing(parsing.markers, parsing.parse_reasoning, parsing.parse_tools and may_call)
    return ChatRun(sequence, rendered.thinking, request_parsing, None if _parallel(request) else 1)


def _message(index: int, message: generate_pb2.ChatMessage) -> dict[str, Any]:
    """A message as transformers' templates expect it (OpenAI shape, arguments as an object)."""
    field = f"messages[{index}]"
    role = _ROLES.get(message.role)
    require(
        message.role != generate_pb2.CHAT_ROLE_UNSPECIFIED, f"{field}.role must be set: SYSTEM, USER, ASSISTANT or TOOL"
    )
    require(role is not None, f"{field}.role {message.role} is not a role: give SYSTEM, USER, ASSISTANT or TOOL")
    out: dict[str, Any] = {"role": role, "content": message.content}
    if message.tool_calls:
        require(role == "assistant", f"{field}.tool_calls is only allowed on an ASSISTANT message")
        out["tool_calls"] = [_past_call(f"{field}.tool_calls[{i}]", call) for i, call in enumerate(message.tool_calls)]
    if message.reasoning_content:
        require(role == "assistant", f"{field}.reasoning_content is only allowed on an ASSISTANT message")
        out["reasoning_content"] = message.reasoning_content
    if message.tool_call_id:
        require(role == "tool", f"{field}.tool_call_id is only allowed on a TOOL message")
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        require(role == "tool", f"{field}.name is only allowed on a TOOL message")
        out["name"] = message.name
    return out


def _past_call(field: str, call: generate_pb2.ToolCall) -> dict[str, Any]:
    require(bool(call.name), f"{field}.name must not be empty")
    arguments = _json_object(call.arguments or "{}", f"{field}.arguments")
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def _json_object(text: str, field: str) -> dict[str, Any]:
    try:
        value = strict_json_loads(text)
    except (ValueError, RecursionError):  # not JSON, or NaN / Infinity
        raise InvalidRequestError(f"{field} must be a JSON object, but it is not valid JSON") from None
    require(isinstance(value, dict), f"{field} must be a JSON object")
    return value


def _tool_choice(request: ChatLike, tools: list[ToolSpec]) -> str:
    """ "none", "auto", "required" or "name:<tool>"."""
    default = "auto" if tools else "none"
    if not request.HasField("tool_choice"):
        return default
    kind = request.tool_choice.WhichOneof("choice")
    if kind == "tool_name":
        name = request.tool_choice.tool_name
        require(bool(tools), f"tool_choice names tool {name!r} but the request gives no tools")
        require(
            any(tool.name == name for tool in tools),
            f"tool_choice names tool {name!r}, which is not one of the request's tools",
        )
        return f"name:{name}"
    mode = request.tool_choice.mode if kind == "mode" else generate_pb2.TOOL_CHOICE_MODE_UNSPECIFIED
    if mode == generate_pb2.TOOL_CHOICE_MODE_REQUIRED:
        require(bool(tools), "tool_choice REQUIRED needs at least one tool in tools")
        return "required"
    if mode == generate_pb2.TOOL_CHOICE_MODE_NONE:
        return "none"
    if mode == generate_pb2.TOOL_CHOICE_MODE_AUTO:
        return "auto"
    require(mode == generate_pb2.TOOL_CHOICE_MODE_UNSPECIFIED, f"tool_choice.mode {mode} is not a known mode")
    return default


def _kwargs(request: ChatLike) -> dict[str, Any] | None:
    if not request.HasField("chat_template_kwargs"):
        return None
    _require_finite(request.chat_template_kwargs, "chat_template_kwargs")
    kwargs = json_format.MessageToDict(request.chat_template_kwargs)
    for key in kwargs:
        require(
            key not in _RESERVED_KWARGS,
            f"chat_template_kwargs.{key} is not allowed: the server sets {key!r} itself",
        )
    return kwargs


def _parallel(request: ChatLike) -> bool:
    """parallel_tool_calls: absent means true (OpenAI's default)."""
    return request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True


def _require_finite(value: struct_pb2.Struct | struct_pb2.ListValue | struct_pb2.Value, field: str) -> None:
    """A Struct may hold NaN or Infinity (protobuf's double), which JSON cannot: refuse it naming
    the place, rather than letting the conversion to JSON fail as an engine error."""
    if isinstance(value, struct_pb2.Struct):
        for key, item in value.fields.items():
            _require_finite(item, f"{field}.{key}")
    elif isinstance(value, struct_pb2.ListValue):
        for index, item in enumerate(value.values):
            _require_finite(item, f"{field}[{index}]")
    else:
        kind = value.WhichOneof("kind")
        if kind == "number_value":
            require(
                math.isfinite(value.number_value),
                f"{field} is {value.number_value}: NaN and Infinity are not JSON values",
            )
        elif kind == "struct_value":
            _require_finite(value.struct_value, field)
        elif kind == "list_value":
            _require_finite(value.list_value, field)
