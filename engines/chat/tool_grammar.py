"""The grammar that makes tool_choice `required` or a named tool a promise: the output is tool calls.

The output allowed is one or more Hermes blocks, one per line, and nothing else (for a named tool,
exactly one block: the grammar then ends and the request stops, where a small model left free to
go on repeats the call until max_tokens):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

the name one of the request's tools (`required`) or the named one, the arguments following that
tool's parameters schema. That is the text Hermes-style models (Qwen, SmolLM2's tool fine-tunes)
write, and what `ChatOutputParser` parses.

Built with xgrammar 0.2.9's structural tags (`tags_with_separator`, one tag per tool, its begin
holding the name) and turned into EBNF text, so it travels as an ordinary `GrammarSpec` through
the compiler, its thread pool and its cache. Each tool's arguments use xgrammar's JSON-schema
conversion with `excludes` set to the end marker, so no argument string can hold `</tool_call>`
and cut the call short for the parser; whitespace inside the JSON is bounded to one character per
place (`max_whitespace_cnt`), so a small model cannot fill max_tokens with it.

With `thinking`, the grammar first allows the reasoning the prompt opened: any text up to the
reasoning end marker, one newline, then the calls; a thinking model may still think before it must
call, and the parser (started in reasoning) puts that text in reasoning_content. Without it the
output starts with the first `<tool_call>`; a parser started in reasoning ends reasoning there.
"""

from __future__ import annotations

import json
import re
from typing import Any

import xgrammar as xgr

from dpgate.chat.tools import InvalidToolError, ToolSpec
from engines.chat.markers import ChatMarkers
from engines.grammar.spec import GrammarKind, GrammarSpec

REQUIRED = "required"
_CPP_LOCATION = re.compile(r"^\s*\[[0-9:]+\]\s+\S+:\d+:\s*")
_MAX_JSON_WHITESPACE = 1


def tool_call_grammar(
    tools: list[ToolSpec], choice: str, markers: ChatMarkers, thinking: bool = False, parallel: bool = True
) -> GrammarSpec:
    """An EBNF `GrammarSpec` of one or more calls of `tools` (choice "required"; exactly one when
    not `parallel`) or of the tool named `choice`. Raises InvalidToolError, naming the field, for a
    choice that names no tool or a tool schema xgrammar cannot follow. Positional arguments only
    (the server runs it in a budgeted child process, engines/grammar/worker_process.py)."""
    if not tools:
        raise InvalidToolError(f"tool_choice {choice} needs at least one tool in tools")
    if choice == REQUIRED:
        chosen = list(enumerate(tools))
    else:
        chosen = [(index, tool) for index, tool in enumerate(tools) if tool.name == choice]
        if not chosen:
            names = ", ".join(tool.name for tool in tools)
            raise InvalidToolError(f"tool_choice.tool_name {choice!r} is not one of the tools: {names}")
    tags = [_call_tag(tool, index, markers) for index, tool in chosen]
    calls: dict[str, Any]
    if choice == REQUIRED and parallel:
        calls = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True}
    elif choice == REQUIRED:  # parallel_tool_calls false: one call of any tool, then the grammar ends
        calls = {"type": "or", "elements": tags} if len(tags) > 1 else tags[0]
    else:  # a named tool is one call of it, as OpenAI's named tool_choice: then the grammar ends, and so does the turn
        calls = tags[0]
    if thinking:
        reasoning = {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": markers.reasoning_end}
        calls = {"type": "sequence", "elements": [reasoning, {"type": "const_string", "value": "\n"}, calls]}
    grammar = _convert("tools", lambda: xgr.Grammar.from_structural_tag(_structural_tag(calls)))
    return GrammarSpec(GrammarKind.EBNF, str(grammar))


def _call_tag(tool: ToolSpec, index: int, markers: ChatMarkers) -> dict[str, Any]:
    arguments = {
        "type": "json_schema",
        "json_schema": tool.parameters,
        "excludes": [markers.tool_call_end],
        "max_whitespace_cnt": _MAX_JSON_WHITESPACE,
    }
    # Converted alone first, so a schema xgrammar refuses is reported with its own index.
    _convert(f"tools[{index}].parameters", lambda: xgr.Grammar.from_structural_tag(_structural_tag(arguments)))
    return {
        "type": "tag",
        "begin": f'{markers.tool_call_start}\n{{"name": {json.dumps(tool.name)}, "arguments": ',
        "content": arguments,
        "end": f"}}\n{markers.tool_call_end}",
    }


def _structural_tag(format_: dict[str, Any]) -> str:
    return json.dumps({"type": "structural_tag", "format": format_})


def _convert(field: str, build: Any) -> Any:
    try:
        return build()
    except (RuntimeError, ValueError) as error:  # xgrammar's refusals of a schema
        reason = _CPP_LOCATION.sub("", str(error)).strip() or "refused by the grammar compiler"
        raise InvalidToolError(f"{field} is not a JSON schema the tool-call grammar can follow: {reason}") from None
