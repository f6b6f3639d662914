"""The readers of a server stream: TokenStream (blocking) and AsyncTokenStream (grpc.aio).

Both fold the stream's messages through one state object, so they yield the same values and end
with the same facts: the finish info, the request id, and the rank that served the call (from the
gateway's trailing metadata). gRPC failures leave them as DpgateError. A GenerateStream is read
with `StreamState` (TextDelta items); ChatStream and AsyncChatStream are the same readers over a
ChatStream, with `ChatStreamState` (ContentDelta, ReasoningDelta and ToolCallItem items).
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc import aio

from dpgate.client.chat_results import ChatItem, ChatStreamState
from dpgate.client.options import serving_rank
from dpgate.client.results import DpgateError, Finish, StreamState, TextDelta


class _StreamReader:
    """What both readers keep: the call, the state its messages are folded into, and how it ended."""

    def __init__(self, call: Any, state: StreamState | None = None) -> None:
        self._call = call
        self._state: StreamState = StreamState() if state is None else state
        self._is_done = False
        self.rank: int | None = None

    @property
    def finish(self) -> Finish | None:
        return self._state.finish

    @property
    def request_id(self) -> str | None:
        return self._state.request_id

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        return self._state.prompt_token_ids

    def cancel(self) -> None:
        """Stop the stream; the server then frees the request."""
        self._is_done = True
        self._call.cancel()


class TokenStream(_StreamReader):
    """A GenerateStream being read: iterate for TextDelta; then `finish`, `rank` and `request_id` are set.

    Use it as a context manager (or call `cancel`) to stop a stream early: the server then frees
    the request. A failure, before or after the first delta, raises DpgateError from the iteration.
    """

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> TextDelta:
        while True:
            try:
                message = next(self._call)
            except StopIteration:
                self._end()
                raise
            except grpc.RpcError as error:
                self._is_done = True
                raise DpgateError.from_rpc_error(error) from None
            delta = self._state.take(message)
            if delta is not None:
                return delta

    def _end(self) -> None:
        if not self._is_done:
            self._is_done = True
            self.rank = serving_rank(self._call.trailing_metadata())
            self._state.check_finished()

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._is_done:
            self.cancel()


class AsyncTokenStream(_StreamReader):
    """The asyncio TokenStream: `async for delta in stream`, then `finish`, `rank` and `request_id`."""

    def __aiter__(self) -> AsyncTokenStream:
        return self

    async def __anext__(self) -> TextDelta:
        while True:
            try:
                message = await self._call.read()
            except grpc.RpcError as error:
                self._is_done = True
                raise DpgateError.from_rpc_error(error) from None
            if message is aio.EOF:
                await self._end()
                raise StopAsyncIteration
            delta = self._state.take(message)
            if delta is not None:
                return delta

    async def _end(self) -> None:
        if not self._is_done:
            self._is_done = True
            self.rank = serving_rank(tuple(await self._call.trailing_metadata() or ()))
            self._state.check_finished()

    async def __aenter__(self) -> AsyncTokenStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if not self._is_done:
            self.cancel()


class ChatStream(TokenStream):
    """A ChatStream being read: iterate for ContentDelta, ReasoningDelta and ToolCallItem."""

    def __init__(self, call: Any) -> None:
        super().__init__(call, ChatStreamState())

    def __next__(self) -> ChatItem:
        return super().__next__()

    def __enter__(self) -> ChatStream:
        return self


class AsyncChatStream(AsyncTokenStream):
    """The asyncio ChatStream: `async for item in stream`, then `finish`, `rank` and `request_id`."""

    def __init__(self, call: aio.UnaryStreamCall) -> None:
        super().__init__(call, ChatStreamState())

    async def __anext__(self) -> ChatItem:
        return await super().__anext__()

    async def __aenter__(self) -> AsyncChatStream:
        return self
