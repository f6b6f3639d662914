"""What a chat call hands back: the assistant turn, and the stream's items of three distinct kinds.

A ChatStream yields `ContentDelta` (answer text), `ReasoningDelta` (the model's thinking) and
`ToolCallItem` (one whole tool call), so a caller separates them with `isinstance` or `match`
instead of testing which field is set. `ChatStreamState` folds the stream's messages the way
`StreamState` does for Generate, so both stream readers end with the same finish info.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpgate.client.chat_messages import ToolCall
from dpgate.client.results import Finish, StreamState, Usage
from dpgate.v1 import generate_pb2


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """New answer text."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """New reasoning text: what the model thought before (or instead of) answering."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ToolCallItem:
    """A tool call the model made, sent whole once its markup closed."""

    tool_call: ToolCall
    token_ids: tuple[int, ...]


ChatItem = ContentDelta | ReasoningDelta | ToolCallItem


@dataclass(frozen=True, slots=True)
class ChatCompletion:
    """A unary Chat's answer; `rank` is the data-parallel rank that served it (None from an engine)."""

    content: str
    reasoning_content: str
    tool_calls: tuple[ToolCall, ...]
    token_ids: tuple[int, ...]
    finish: Finish
    rank: int | None
    response: generate_pb2.ChatResponse

    @property
    def usage(self) -> Usage:
        return self.finish.usage


def chat_completion(response: generate_pb2.ChatResponse, rank: int | None) -> ChatCompletion:
    return ChatCompletion(
        content=response.content,
        reasoning_content=response.reasoning_content,
        tool_calls=tuple(ToolCall.from_message(call) for call in response.tool_calls),
        token_ids=tuple(response.token_ids),
        finish=Finish.from_message(response.finish),
        rank=rank,
        response=response,
    )


class ChatStreamState(StreamState):
    """The facts of one ChatStream so far: StreamState, with ChatDelta messages read as chat items."""

    __slots__ = ()

    def _item(self, delta: generate_pb2.ChatDelta) -> ChatItem | None:
        """A ChatDelta as its item, by kind; a markup-only delta (no kind) carries none."""
        token_ids = tuple(delta.token_ids)
        kind = delta.WhichOneof("kind")
        if kind == "content":
            return ContentDelta(delta.content, token_ids)
        if kind == "reasoning_content":
            return ReasoningDelta(delta.reasoning_content, token_ids)
        if kind == "tool_call":
            return ToolCallItem(ToolCall.from_message(delta.tool_call), token_ids)
        return None
