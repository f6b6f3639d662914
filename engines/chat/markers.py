"""The markup a model writes around its reasoning and its tool calls, and which parsers a model gets.

Models differ: Qwen3 and SmolLM3 reason between `<think>` and `</think>`, Hermes-style models (SmolLM2's
tool-use fine-tunes, Qwen2.5/3) wrap a JSON call in `<tool_call>` ... `</tool_call>`. The choice is
configuration, not code: a table keyed by the model's architecture gives the default, and the engine
flags `--reasoning-parser none|think`, `--reasoning-markers START,END` and `--tool-call-parser
none|hermes` override it. Nothing outside this file branches on a parser's name; the output parser
reads only `ChatParsing`. The markers themselves (dpgate/chat/markers.py) sit on the floor: the
chat rendering the gateway shares writes tool calls with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dpgate.chat.markers import ChatMarkers, MarkerConfigError

REASONING_PARSERS = ("none", "think")
TOOL_CALL_PARSERS = ("none", "hermes")


@dataclass(frozen=True, slots=True)
class ChatParsing:
    """What the output parser looks for. With `parse_reasoning` False the reasoning markers are plain
    text and everything is content; with `parse_tools` False tool-call markup is plain content."""

    markers: ChatMarkers = field(default_factory=ChatMarkers)
    parse_reasoning: bool = True
    parse_tools: bool = True


# architecture (GGUF general.architecture, or config.json's model_type as engines/model/config.py names it)
# -> (reasoning parser, tool-call parser). Parsing markers a model never writes costs nothing and
# catches fine-tunes that do, so both served families parse both.
PARSERS_BY_ARCHITECTURE: dict[str, tuple[str, str]] = {
    "llama": ("think", "hermes"),
    "gemma3": ("think", "hermes"),
}
DEFAULT_PARSERS = ("think", "hermes")


def chat_parsing(
    architecture: str,
    *,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
    reasoning_markers: str | None = None,
) -> ChatParsing:
    """The parsers for a model: the table's choice for `architecture`, overridden by the flags given
    (None = flag not given). `reasoning_markers` is the flag's text, "START,END"."""
    default_reasoning, default_tools = PARSERS_BY_ARCHITECTURE.get(architecture, DEFAULT_PARSERS)
    reasoning = default_reasoning if reasoning_parser is None else reasoning_parser
    tools = default_tools if tool_call_parser is None else tool_call_parser
    if reasoning not in REASONING_PARSERS:
        raise MarkerConfigError(f"--reasoning-parser {reasoning} must be one of {', '.join(REASONING_PARSERS)}")
    if tools not in TOOL_CALL_PARSERS:
        raise MarkerConfigError(f"--tool-call-parser {tools} must be one of {', '.join(TOOL_CALL_PARSERS)}")
    markers = ChatMarkers()
    if reasoning_markers is not None:
        start, end = parse_reasoning_markers(reasoning_markers)
        try:
            markers = ChatMarkers(reasoning_start=start, reasoning_end=end)
        except MarkerConfigError as error:
            raise MarkerConfigError(f"--reasoning-markers {reasoning_markers}: {error}") from None
    return ChatParsing(markers, parse_reasoning=reasoning == "think", parse_tools=tools == "hermes")


def parse_reasoning_markers(text: str) -> tuple[str, str]:
    """`--reasoning-markers START,END` -> (START, END): two non-empty, different markers."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 2 or not all(parts):
        raise MarkerConfigError(f"--reasoning-markers {text} must be START,END (two non-empty markers)")
    if parts[0] == parts[1]:
        raise MarkerConfigError(f"--reasoning-markers {text} must name two different markers")
    return parts[0], parts[1]
