"""The markup a model writes around its reasoning and its tool calls (which parsers read it is the
engine's choice, engines/chat/markers.py).

On the floor because rendering a chat prompt writes tool definitions and earlier calls with these
markers, and the gateway renders prompts exactly as the engine does (dpgate/chat/template.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ChatMarkers:
    reasoning_start: str = "<think>"
    reasoning_end: str = "</think>"
    tool_call_start: str = "<tool_call>"
    tool_call_end: str = "</tool_call>"

    def __post_init__(self) -> None:
        markers = (self.reasoning_start, self.reasoning_end, self.tool_call_start, self.tool_call_end)
        if any(marker == "" or marker != marker.strip() for marker in markers):
            raise MarkerConfigError(f"chat markers must be non-empty with no surrounding whitespace: {markers!r}")
        if len(set(markers)) != len(markers):
            raise MarkerConfigError(f"chat markers must differ from each other: {markers!r}")
        for marker in markers:
            for other in markers:
                if marker != other and marker in other:
                    # The parser matches the first marker found: one inside another would cut it short.
                    raise MarkerConfigError(f"chat marker {marker!r} must not occur inside {other!r}")


class MarkerConfigError(ValueError):
    """A parser flag or marker set the engine cannot use; the message names the flag."""
