"""What a chat call hands back: the assistant turn, and the stream's items of three distinct kinds.

A ChatStream yields `ContentDelta` (answer text), `ReasoningDelta` (the model's thinking) and
`ToolCallItem` (one whole tool call), so a caller separates them with `isinstance` or `match`
instead of testing which field is set. `ChatStreamState` folds the stream's messages the way
`StreamState` does for Generate, so both stream readers end with the same finish info.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from dpgate.v1 import generate_pb2
from gateway.chat_messages import ToolCall
from gateway.client_results import DpgateError, Finish, Usage


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


class ChatStreamState:
    """The facts of one ChatStream so far, fed one message at a time by `take`."""

    __slots__ = ("finish", "prompt_token_ids", "request_id")

    def __init__(self) -> None:
        self.request_id: str | None = None
        self.prompt_token_ids: tuple[int, ...] = ()
        self.finish: Finish | None = None

    def take(self, message: generate_pb2.ChatStreamResponse) -> ChatItem | None:
        """Record `message`; return its item when it carries output (a markup-only delta carries none)."""
        event = message.WhichOneof("event")
        if event == "delta":
            delta = message.delta
            token_ids = tuple(delta.token_ids)
            kind = delta.WhichOneof("kind")
            if kind == "content":
                return ContentDelta(delta.content, token_ids)
            if kind == "reasoning_content":
                return ReasoningDelta(delta.reasoning_content, token_ids)
            if kind == "tool_call":
                return ToolCallItem(ToolCall.from_message(delta.tool_call), token_ids)
        elif event == "prompt_info":
            self.request_id = message.prompt_info.request_id
            self.prompt_token_ids = tuple(message.prompt_info.prompt_token_ids)
        elif event == "finish":
            self.finish = Finish.from_message(message.finish)
        return None

    def check_finished(self) -> None:
        """Raise when the server closed the stream with OK but never sent its finish info."""
        if self.finish is None:
            raise DpgateError(grpc.StatusCode.INTERNAL, "the stream ended without finish info")
