"""What a dpgate client hands back: completions, stream deltas, finish info and errors.

Plain frozen dataclasses instead of protobuf messages, so that a caller reads `finish.reason` and
`usage.completion_tokens` without knowing the schema; the message each one came from stays
reachable for the fields not copied here (logprobs, for one). `StreamState` folds the messages of
one GenerateStream into these, the same way for the blocking and the asyncio stream.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import grpc

from dpgate.v1 import generate_pb2


class DpgateError(Exception):
    """A call that failed: `code` is the gRPC status code, `message` the server's text.

    `str(error)` reads `CODE: message`, the form `dpgate generate` prints.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> DpgateError:
        # Every RpcError grpc raises for a call is also a grpc.Call with code() and details().
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code, details or "")


class FinishReason(enum.StrEnum):
    """Why generation ended."""

    LENGTH = "length"
    STOP = "stop"
    ABORTED = "aborted"
    UNSPECIFIED = "unspecified"


_FINISH_REASONS = {
    generate_pb2.FINISH_REASON_LENGTH: FinishReason.LENGTH,
    generate_pb2.FINISH_REASON_STOP: FinishReason.STOP,
    generate_pb2.FINISH_REASON_ABORTED: FinishReason.ABORTED,
}


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one call; completion_tokens includes a matched stop token."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache gave (not recomputed)


@dataclass(frozen=True, slots=True)
class Finish:
    """How generation ended: the reason, what stop matched (a token id or a string) and the counts."""

    reason: FinishReason
    matched_stop: int | str | None
    usage: Usage

    @classmethod
    def from_message(cls, message: generate_pb2.FinishInfo) -> Finish:
        which = message.WhichOneof("matched_stop")
        return cls(
            reason=_FINISH_REASONS.get(message.reason, FinishReason.UNSPECIFIED),
            matched_stop=None if which is None else getattr(message, which),
            usage=Usage(message.num_prompt_tokens, message.num_generated_tokens, message.num_cached_prompt_tokens),
        )


@dataclass(frozen=True, slots=True)
class Completion:
    """A unary Generate's answer; `rank` is the data-parallel rank that served it (None from an engine)."""

    text: str
    token_ids: tuple[int, ...]
    finish: Finish
    rank: int | None
    response: generate_pb2.GenerateResponse

    @property
    def usage(self) -> Usage:
        return self.finish.usage


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New output of one step: its text (possibly empty while a character is incomplete) and token ids."""

    text: str
    token_ids: tuple[int, ...]
    message: generate_pb2.Delta


class StreamState:
    """The facts of one GenerateStream so far, fed one message at a time by `take`."""

    __slots__ = ("finish", "prompt_token_ids", "request_id")

    def __init__(self) -> None:
        self.request_id: str | None = None
        self.prompt_token_ids: tuple[int, ...] = ()
        self.finish: Finish | None = None

    def take(self, message: generate_pb2.GenerateStreamResponse | generate_pb2.ChatStreamResponse) -> Any:
        """Record `message`; return its item (`_item` of its delta) when it carries output, else None."""
        event = message.WhichOneof("event")
        if event == "delta":
            return self._item(message.delta)
        if event == "prompt_info":
            self.request_id = message.prompt_info.request_id
            self.prompt_token_ids = tuple(message.prompt_info.prompt_token_ids)
        elif event == "finish":
            self.finish = Finish.from_message(message.finish)
        return None

    def _item(self, delta: generate_pb2.Delta) -> TextDelta | None:
        """A delta message as the stream's item (a subclass reads other delta messages)."""
        return TextDelta(delta.text, tuple(delta.token_ids), delta)

    def check_finished(self) -> None:
        """Raise when the server closed the stream with OK but never sent its finish info."""
        if self.finish is None:
            raise DpgateError(grpc.StatusCode.INTERNAL, "the stream ended without finish info")


def completion(response: generate_pb2.GenerateResponse, rank: int | None) -> Completion:
    return Completion(response.text, tuple(response.token_ids), Finish.from_message(response.finish), rank, response)
