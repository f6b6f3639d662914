"""Turns a wire ChatRequest / ChatStreamRequest into the `Sequence` the engine runs, and what the
output parser needs to read its output.

Every rule a chat client can break is checked here: messages, tools and the template kwargs by
dpgate/chat/request.py (the gateway renders the same prompt with it), tool_choice here. The
generation fields then go through the very code Generate uses (`assemble_sequence`, with the
rendered prompt's token ids), so sampling, stopping, logprobs and structured output mean exactly
what they mean for Generate. The prompt is tokenized without adding special tokens: the template
already wrote them. A tool_choice of REQUIRED or a named tool becomes the request's grammar
(engines/chat/tool_grammar.py), so the call parses and its arguments follow the tool's schema.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpgate.chat.request import chat_inputs, render_chat
from dpgate.chat.template import ChatTemplate
from dpgate.chat.tools import ToolSpec
from dpgate.v1 import generate_pb2
from engines.chat.markers import ChatParsing
from engines.sampling.params import require
from engines.scheduling.detokenizer import Decoder
from engines.scheduling.sequence import Sequence
from engines.serving.request_builder import (
    ChatLike,
    ModelLimits,
    assemble_sequence,
    check_model,
    require_tokenizable,
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
    inputs = chat_inputs(request)  # the gateway reads the same inputs to hash the prompt (dpgate/chat/)
    tools = inputs.tools
    choice = _tool_choice(request, tools)
    constrained = choice == "required" or choice.startswith("name:")
    require(
        not (constrained and request.HasField("structured_output")),
        "structured_output cannot be given with a tool_choice of REQUIRED or a named tool, which constrain "
        "the output themselves",
    )
    rendered = render_chat(template, inputs)
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


def _parallel(request: ChatLike) -> bool:
    """parallel_tool_calls: absent means true (OpenAI's default)."""
    return request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True


