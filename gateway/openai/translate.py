"""OpenAI request bodies -> dpgate.v1 requests: the one place an HTTP field gets its meaning.

`chat_plan` reads a `/v1/chat/completions` body, `completion_plan` a `/v1/completions` body; each
returns a `Plan`: the RPC to call and one serialized request per choice (`n` choices, and for
completions `n` per prompt), plus what the response builders need. Every field is read through
`Fields`, so an unknown or mistyped field is a 400 that names it; ranges the engine owns
(temperature, top_p, max_tokens against the context) are the engine's to check, and its
INVALID_ARGUMENT comes back as a 400 with its sentence. docs/http-api.md lists the mapping.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Final

from google.protobuf import struct_pb2

from dpgate.json_text import json_type_name
from dpgate.v1 import generate_pb2
from gateway.openai.errors import RequestError
from gateway.openai.fields import Fields
from gateway.openai.generation_fields import (
    is_token_id,
    sampling_fields,
    stopping_fields,
    structured_output_fields,
)

MAX_CHOICES: Final = 64
MAX_TOP_LOGPROBS: Final = 20
REASONING_EFFORTS: Final = ("none", "minimal", "low", "medium", "high")
_ROLES: Final = {
    "system": generate_pb2.CHAT_ROLE_SYSTEM,
    "developer": generate_pb2.CHAT_ROLE_SYSTEM,  # OpenAI's newer name for system instructions
    "user": generate_pb2.CHAT_ROLE_USER,
    "assistant": generate_pb2.CHAT_ROLE_ASSISTANT,
    "tool": generate_pb2.CHAT_ROLE_TOOL,
}
_MODES: Final = {
    "none": generate_pb2.TOOL_CHOICE_MODE_NONE,
    "auto": generate_pb2.TOOL_CHOICE_MODE_AUTO,
    "required": generate_pb2.TOOL_CHOICE_MODE_REQUIRED,
}
_SERVICE: Final = "/dpgate.v1.InferenceService/"


@dataclass(slots=True)
class Plan:
    """What one HTTP request becomes.

    `requests[i]` is the serialized request of choice i; for completions choice i answers prompt
    `i // n`. `model` is the name the client sent ("" for the engine's only model).
    """

    path: bytes
    requests: list[bytes]
    stream: bool
    model: str
    n: int = 1
    include_usage: bool = False
    logprobs: bool = False
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage in every chunk
    created: int = field(default_factory=lambda: int(time.time()))


# --- /v1/chat/completions ---------------------------------------------------------------------


def chat_plan(body: Any) -> Plan:
    fields = Fields(body)
    stream, include_usage, continuous = _stream(fields)
    request = generate_pb2.ChatStreamRequest() if stream else generate_pb2.ChatRequest()
    model = fields.take_str("model") or ""
    request.model = model
    messages = fields.take_list("messages")
    if not messages:
        raise RequestError("messages must be a non-empty array of messages", "messages")
    request.messages.extend(_message(index, message) for index, message in enumerate(messages))
    _tools(fields, request)
    _template_kwargs(fields, request)
    sampling_fields(fields, request.sampling)
    stopping_fields(fields, request.stopping, max_tokens_keys=("max_completion_tokens", "max_tokens"))
    structured_output_fields(fields, request)
    logprobs = bool(fields.take_bool("logprobs"))
    top = fields.take_int("top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise RequestError("top_logprobs needs logprobs set to true", "top_logprobs")
    if logprobs:
        request.logprobs.top_n = top or 0
    n = fields.take_int("n", 1, MAX_CHOICES) or 1
    fields.refuse_rest()
    payload = request.SerializeToString()
    path = f"{_SERVICE}{'ChatStream' if stream else 'Chat'}".encode()
    return Plan(path, [payload] * n, stream, model, n, include_usage, logprobs, continuous)


def _message(index: int, value: Any) -> generate_pb2.ChatMessage:
    where = f"messages[{index}]"
    fields = Fields(value, f"{where}.", where)
    role_name = fields.take_str("role")
    if role_name not in _ROLES:
        names = ", ".join(_ROLES)
        raise RequestError(f"{where}.role must be one of {names}, not {role_name!r}", f"{where}.role")
    message = generate_pb2.ChatMessage(role=_ROLES[role_name])
    message.content = _content(fields, where)
    if role_name == "assistant":
        reasoning = fields.take_str("reasoning_content")
        if reasoning is None:
            reasoning = fields.take_str("reasoning")
        message.reasoning_content = reasoning or ""
        for call_index, call in enumerate(fields.take_list("tool_calls") or []):
            message.tool_calls.append(_past_call(f"{where}.tool_calls[{call_index}]", call))
    elif role_name == "tool":
        call_id = fields.take_str("tool_call_id")
        if not call_id:
            raise RequestError(f"{where}.tool_call_id is required on a tool message", f"{where}.tool_call_id")
        message.tool_call_id = call_id
        message.name = fields.take_str("name") or ""
    fields.refuse_rest()
    return message


def _content(fields: Fields, where: str) -> str:
    """A message's text: a string, or an array of text parts joined by newlines (as vLLM joins them)."""
    value = fields.take("content")
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, list):
        raise RequestError(
            f"{where}.content must be a string or an array of text parts, not {json_type_name(value)}",
            f"{where}.content",
        )
    texts = []
    for index, part in enumerate(value):
        name = f"{where}.content[{index}]"
        part_fields = Fields(part, f"{name}.", name)
        kind = part_fields.take_str("type")
        if kind != "text":
            raise RequestError(f"{name}.type {kind!r} is not supported: only text parts are", f"{name}.type")
        text = part_fields.take_str("text")
        if text is None:
            raise RequestError(f"{name}.text is required", f"{name}.text")
        part_fields.refuse_rest()
        texts.append(text)
    return "\n".join(texts)


def _past_call(where: str, value: Any) -> generate_pb2.ToolCall:
    fields = Fields(value, f"{where}.", where)
    kind = fields.take_str("type") or "function"
    if kind != "function":
        raise RequestError(f"{where}.type must be 'function', not {kind!r}", f"{where}.type")
    function = fields.take_object("function")
    if function is None:
        raise RequestError(f"{where}.function is required", f"{where}.function")
    call = generate_pb2.ToolCall(id=fields.take_str("id") or "", name=function.take_str("name") or "")
    call.arguments = function.take_str("arguments") or "{}"
    function.refuse_rest()
    fields.refuse_rest()
    return call


def _tools(fields: Fields, request: generate_pb2.ChatRequest | generate_pb2.ChatStreamRequest) -> None:
    for index, value in enumerate(fields.take_list("tools") or []):
        where = f"tools[{index}]"
        tool_fields = Fields(value, f"{where}.", where)
        kind = tool_fields.take_str("type")
        if kind != "function":
            raise RequestError(f"{where}.type must be 'function', not {kind!r}", f"{where}.type")
        function = tool_fields.take_object("function")
        if function is None:
            raise RequestError(f"{where}.function is required", f"{where}.function")
        tool = request.tools.add(name=function.take_str("name") or "")
        tool.description = function.take_str("description") or ""
        parameters = function.take_dict("parameters")
        if parameters is not None:
            tool.parameters = json.dumps(parameters)
        # OpenAI's strict: the arguments follow the schema. Under tool_choice required or a named
        # tool they always do here (a grammar); under auto they are parsed, not constrained
        # (docs/http-api.md says so).
        function.take_bool("strict")
        function.refuse_rest()
        tool_fields.refuse_rest()
    choice = fields.take("tool_choice")
    if isinstance(choice, str):
        if choice not in _MODES:
            rule = f"tool_choice must be none, auto, required or a named function, not {choice!r}"
            raise RequestError(rule, "tool_choice")
        request.tool_choice.mode = _MODES[choice]
    elif choice is not None:
        choice_fields = Fields(choice, "tool_choice.", "tool_choice")
        if choice_fields.take_str("type") != "function":
            raise RequestError("tool_choice.type must be 'function'", "tool_choice.type")
        function = choice_fields.take_object("function")
        name = function.take_str("name") if function is not None else None
        if not name:
            raise RequestError("tool_choice.function.name is required", "tool_choice.function.name")
        assert function is not None
        function.refuse_rest()
        choice_fields.refuse_rest()
        request.tool_choice.tool_name = name
    parallel = fields.take_bool("parallel_tool_calls")
    if parallel is not None:
        request.parallel_tool_calls = parallel


def _template_kwargs(fields: Fields, request: generate_pb2.ChatRequest | generate_pb2.ChatStreamRequest) -> None:
    kwargs = dict(fields.take_dict("chat_template_kwargs") or {})
    effort = fields.take_str("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise RequestError(
                f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, not {effort!r}", "reasoning_effort"
            )
        if kwargs.get("reasoning_effort", effort) != effort:
            raise RequestError(
                "reasoning_effort and chat_template_kwargs.reasoning_effort disagree", "reasoning_effort"
            )
        kwargs["reasoning_effort"] = effort
    if kwargs or fields.has("chat_template_kwargs"):
        struct = struct_pb2.Struct()
        struct.update(kwargs)
        request.chat_template_kwargs.CopyFrom(struct)


# --- /v1/completions --------------------------------------------------------------------------


def completion_plan(body: Any) -> Plan:
    fields = Fields(body)
    stream, include_usage, continuous = _stream(fields)
    model = fields.take_str("model") or ""
    prompts = _prompts(fields)
    template = generate_pb2.GenerateStreamRequest() if stream else generate_pb2.GenerateRequest()
    template.model = model
    sampling_fields(fields, template.sampling)
    stopping_fields(fields, template.stopping, max_tokens_keys=("max_tokens",))
    structured_output_fields(fields, template)
    top = fields.take_int("logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None:
        template.logprobs.top_n = top
    n = fields.take_int("n", 1, MAX_CHOICES) or 1
    best_of = fields.take_int("best_of", 1, MAX_CHOICES)
    if best_of is not None and best_of != n:
        raise RequestError("best_of is not supported other than equal to n", "best_of")
    if fields.take_bool("echo"):
        raise RequestError("echo is not supported: send the prompt back yourself", "echo")
    fields.refuse_rest()
    requests = []
    for prompt in prompts:
        request = type(template)()
        request.CopyFrom(template)
        if isinstance(prompt, str):
            request.text = prompt
        else:
            request.token_ids.ids.extend(prompt)
        requests.extend([request.SerializeToString()] * n)
    path = f"{_SERVICE}{'GenerateStream' if stream else 'Generate'}".encode()
    return Plan(path, requests, stream, model, n, include_usage, top is not None, continuous)


def _prompts(fields: Fields) -> list[str | list[int]]:
    """prompt: a string, an array of strings, an array of token ids, or an array of those arrays."""
    value = fields.take("prompt")
    rule = "prompt must be a string, an array of strings, an array of token ids or an array of such arrays"
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise RequestError(rule, "prompt")
    if all(isinstance(item, str) for item in value):
        return list(value)
    if all(is_token_id(item) for item in value):
        return [list(value)]
    if all(isinstance(item, list) and item and all(is_token_id(token) for token in item) for item in value):
        return [list(item) for item in value]
    raise RequestError(rule, "prompt")


# --- shared by both endpoints -----------------------------------------------------------------


def _stream(fields: Fields) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage_stats)."""
    stream = bool(fields.take_bool("stream"))
    options = fields.take_object("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not stream:
            raise RequestError("stream_options is only allowed with stream set to true", "stream_options")
        include_usage = bool(options.take_bool("include_usage"))
        continuous = bool(options.take_bool("continuous_usage_stats"))
        options.refuse_rest()
    return stream, include_usage, continuous
