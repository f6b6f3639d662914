"""Python clients for dpgate.v1 servers (a gateway or an engine): blocking and asyncio, one surface.

`DpgateClient` (grpc's blocking channel) and `AsyncDpgateClient` (grpc.aio) take the same arguments
and offer the same calls: `generate` (one answer), `stream` (text deltas as they are generated, then
the finish reason and token counts), `chat` and `chat_stream` (the next assistant turn of a
conversation: content, reasoning and tool calls, whole or as they are parsed) and `server_info`.
Each client can pin a data-parallel rank (metadata `x-data-parallel-rank`; a call can pin its own),
send an API key the way the gateway checks it (`authorization: Bearer KEY`), set a default
deadline, and speak TLS or mutual TLS (`TlsOptions`). A failed call raises `DpgateError` carrying
the gRPC code and the server's message; bad arguments raise ValueError naming the argument before
anything is sent.

Blocking::

    from dpgate.client import DpgateClient, GenerationOptions

    with DpgateClient("127.0.0.1:50051", rank=0, timeout=30) as client:
        with client.stream("The capital of France is", GenerationOptions(max_tokens=16)) as stream:
            for delta in stream:
                print(delta.text, end="", flush=True)
        print(stream.finish.reason, stream.finish.usage, "served by rank", stream.rank)

asyncio::

    async with AsyncDpgateClient("127.0.0.1:50051", api_key="KEY") as client:
        async for delta in client.stream("Hello", GenerationOptions(max_tokens=8)):
            print(delta.text, end="")
        answer = await client.generate("Hello")   # answer.text, answer.finish, answer.rank

Chat (messages as ChatMessage or dicts; tools as ChatTool or dicts with a JSON-schema dict)::

    messages = [{"role": "user", "content": "Weather in Paris?"}]
    tools = [ChatTool("get_weather", "Current weather", {"type": "object", "properties": {"city": {"type": "string"}}})]
    with client.chat_stream(messages, tools=tools, chat_template_kwargs={"thinking": False}) as stream:
        for item in stream:   # ContentDelta, ReasoningDelta or ToolCallItem
            ...
    answer = client.chat(messages, tools=tools, tool_choice="required")   # .content, .tool_calls, .finish

Anything more exotic can be sent by building the request messages directly and calling the stubs
`inference` / `control` with `metadata=client.metadata`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from grpc import aio

from dpgate.client.chat_messages import ChatInput, ChatMessage, ChatTool, MessageInput, ToolCall, ToolInput
from dpgate.client.chat_results import (
    ChatCompletion,
    ChatItem,
    ContentDelta,
    ReasoningDelta,
    ToolCallItem,
    chat_completion,
)
from dpgate.client.options import (
    DEFAULT_OPTIONS,
    RANK_METADATA_KEY,
    GenerationOptions,
    TlsOptions,
    call_metadata,
    check_api_key,
    check_rank,
    check_timeout,
    serving_rank,
)
from dpgate.client.results import Completion, DpgateError, Finish, FinishReason, TextDelta, Usage, completion
from dpgate.client.streams import AsyncChatStream, AsyncTokenStream, ChatStream, TokenStream
from dpgate.v1 import control_pb2, control_pb2_grpc, generate_pb2_grpc

__all__ = [
    "RANK_METADATA_KEY",
    "AsyncChatStream",
    "AsyncDpgateClient",
    "AsyncTokenStream",
    "ChatCompletion",
    "ChatItem",
    "ChatMessage",
    "ChatStream",
    "ChatTool",
    "Completion",
    "ContentDelta",
    "DpgateClient",
    "DpgateError",
    "Finish",
    "FinishReason",
    "GenerationOptions",
    "ReasoningDelta",
    "TextDelta",
    "TlsOptions",
    "TokenStream",
    "ToolCall",
    "ToolCallItem",
    "Usage",
]

ChannelOptions = Sequence[tuple[str, Any]]


class _Settings:
    """What both clients check once and apply to every call: pin, key, deadline, transport."""

    __slots__ = ("api_key", "channel_options", "credentials", "rank", "timeout", "wait_for_ready")

    def __init__(
        self,
        address: str,
        rank: int | None,
        api_key: str | None,
        timeout: float | None,
        tls: TlsOptions | None,
        credentials: grpc.ChannelCredentials | None,
        channel_options: ChannelOptions,
        wait_for_ready: bool,
    ) -> None:
        if not isinstance(address, str) or not address.strip():
            raise ValueError(f"address must be a non-empty HOST:PORT (or gRPC target), got {address!r}")
        if tls is not None and credentials is not None:
            raise ValueError("give tls or credentials, not both")
        self.rank = check_rank(rank)
        self.api_key = check_api_key(api_key)
        self.timeout = check_timeout(timeout)
        self.credentials = tls.credentials() if tls is not None else credentials
        self.channel_options = (*channel_options, *(tls.channel_options() if tls is not None else ()))
        self.wait_for_ready = wait_for_ready

    def call(self, rank: int | None, timeout: float | None) -> dict[str, Any]:
        """Keyword arguments for one stub call; a call's own rank and timeout win over the client's."""
        rank = self.rank if rank is None else check_rank(rank)
        timeout = self.timeout if timeout is None else check_timeout(timeout)
        return {
            "metadata": call_metadata(rank, self.api_key),
            "timeout": timeout,
            "wait_for_ready": self.wait_for_ready,
        }


class _ClientBase:
    """What both clients hold: the checked settings, one channel and the two stubs over it.

    `_channels` is the module that makes the channel, grpc (blocking) or grpc.aio; the stubs are
    the same classes over either.
    """

    _channels: Any = grpc

    def __init__(
        self,
        address: str,
        *,
        rank: int | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        tls: TlsOptions | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel_options: ChannelOptions = (),
        wait_for_ready: bool = False,
    ) -> None:
        self._settings = _Settings(
            address, rank=rank, api_key=api_key, timeout=timeout, tls=tls, credentials=credentials,
            channel_options=channel_options, wait_for_ready=wait_for_ready,
        )  # fmt: skip
        options = self._settings.channel_options
        credentials = self._settings.credentials
        self.channel = (
            self._channels.secure_channel(address, credentials, options)
            if credentials is not None
            else self._channels.insecure_channel(address, options)
        )
        self.inference = generate_pb2_grpc.InferenceServiceStub(self.channel)
        self.control = control_pb2_grpc.ControlServiceStub(self.channel)
        self.metadata = call_metadata(self._settings.rank, self._settings.api_key)


class DpgateClient(_ClientBase):
    """A blocking client over one channel; see the module docstring for an example.

    `rank` pins every call to a data-parallel rank (a call's own `rank` wins); `api_key` is sent as
    `authorization: Bearer KEY`; `timeout` is the default deadline in seconds (None: none);
    `tls` turns on TLS (`credentials` takes any other grpc.ChannelCredentials instead);
    `wait_for_ready` makes calls wait for the channel instead of failing UNAVAILABLE at once.
    """

    def __enter__(self) -> DpgateClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def generate(
        self,
        prompt: str,
        options: GenerationOptions = DEFAULT_OPTIONS,
        timeout: float | None = None,
        *,
        rank: int | None = None,
    ) -> Completion:
        """The whole completion of `prompt` in one answer."""
        request = options.generate_request(prompt)
        try:
            response, call = self.inference.Generate.with_call(request, **self._settings.call(rank, timeout))
        except grpc.RpcError as error:
            raise DpgateError.from_rpc_error(error) from None
        return completion(response, serving_rank(call.trailing_metadata()))

    def stream(
        self,
        prompt: str,
        options: GenerationOptions = DEFAULT_OPTIONS,
        timeout: float | None = None,
        *,
        rank: int | None = None,
    ) -> TokenStream:
        """The completion of `prompt` as it is generated: iterate the stream for TextDelta."""
        request = options.stream_request(prompt)
        return TokenStream(self.inference.GenerateStream(request, **self._settings.call(rank, timeout)))

    def chat(
        self,
        messages: Sequence[MessageInput],
        options: GenerationOptions = DEFAULT_OPTIONS,
        timeout: float | None = None,
        *,
        tools: Sequence[ToolInput] = (),
        tool_choice: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        rank: int | None = None,
    ) -> ChatCompletion:
        """The next assistant turn of `messages` in one answer: content, reasoning and tool calls.

        `tool_choice` is "none", "auto", "required" or a tool's name (None: the server's default);
        a None value in `chat_template_kwargs` is sent as JSON null, which opts out where it matters.
        """
        request = ChatInput.build(messages, tools, tool_choice, chat_template_kwargs).chat_request(options)
        try:
            response, call = self.inference.Chat.with_call(request, **self._settings.call(rank, timeout))
        except grpc.RpcError as error:
            raise DpgateError.from_rpc_error(error) from None
        return chat_completion(response, serving_rank(call.trailing_metadata()))

    def chat_stream(
        self,
        messages: Sequence[MessageInput],
        options: GenerationOptions = DEFAULT_OPTIONS,
        timeout: float | None = None,
        *,
        tools: Sequence[ToolInput] = (),
        tool_choice: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        rank: int | None = None,
    ) -> ChatStream:
        """The next assistant turn as it is parsed: iterate for ContentDelta, ReasoningDelta, ToolCallItem."""
        request = ChatInput.build(messages, tools, tool_choice, chat_template_kwargs).stream_request(options)
        return ChatStream(self.inference.ChatStream(request, **self._settings.call(rank, timeout)))

    def server_info(
        self, timeout: float | None = None, *, rank: int | None = None
    ) -> control_pb2.GetServerInfoResponse:
        """The serving engine's version, parallelism (its dp rank among them) and cache geometry."""
        request = control_pb2.GetServerInfoRequest()
        try:
            return self.control.GetServerInfo(request, **self._settings.call(rank, timeout))
        except grpc.RpcError as error:
            raise DpgateError.from_rpc_error(error) from None


class AsyncDpgateClient(_ClientBase):
    """The asyncio client (grpc.aio): DpgateClient's arguments and calls, awaited.

    Create it inside the event loop that uses it; `stream` returns its stream at once (no await)
    so that `async for delta in client.stream(...)` reads naturally.
    """

    _channels = aio

    async def __aenter__(self) -> AsyncDpgateClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def generate(
        self,
        prompt: str,
        options: GenerationOptions = DEFAULT_OPTIONS,
        timeout: float | None = None,
        *,
        rank: int | None = None,
    ) -> Completion:
        """The whole completion of `prompt` in one answer."""
        call = self.inference.Generate(options.generate_request(prompt), **self._settings.call(rank, timeout))
        try:
            response = await call
            trailing = await call.trailing_metadata()
        except grpc.RpcError as error:
            raise DpgateError.from_rpc_error(error) from None
        return completion(response, serving_rank(tuple(trailing or ())))

    def stream(
        self,
        prompt: str,
        options: GenerationOptions = DEFAULT_OPTIONS,
        timeout: float | None = None,
        *,
        rank: int | None = None,
    ) -> AsyncTokenStream:
        """The completion of `prompt` as it is generated: `async for` the stream for TextDelta."""
        request = options.stream_request(prompt)
        return AsyncTokenStream(self.inference.GenerateStream(request, **self._settings.call(rank, timeout)))

    async def chat(
        self,
        messages: Sequence[MessageInput],
        options: GenerationOptions = DEFAULT_OPTIONS,
        timeout: float | None = None,
        *,
        tools: Sequence[ToolInput] = (),
        tool_choice: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        rank: int | None = None,
    ) -> ChatCompletion:
        """The next assistant turn of `messages` in one answer; DpgateClient.chat's arguments."""
        request = ChatInput.build(messages, tools, tool_choice, chat_template_kwargs).chat_request(options)
        call = self.inference.Chat(request, **self._settings.call(rank, timeout))
        try:
            response = await call
            trailing = await call.trailing_metadata()
        except grpc.RpcError as error:
            raise DpgateError.from_rpc_error(error) from None
        return chat_completion(response, serving_rank(tuple(trailing or ())))

    def chat_stream(
        self,
        messages: Sequence[MessageInput],
        options: GenerationOptions = DEFAULT_OPTIONS,
        timeout: float | None = None,
        *,
        tools: Sequence[ToolInput] = (),
        tool_choice: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        rank: int | None = None,
    ) -> AsyncChatStream:
        """The next assistant turn as it is parsed: `async for` ContentDelta, ReasoningDelta, ToolCallItem."""
        request = ChatInput.build(messages, tools, tool_choice, chat_template_kwargs).stream_request(options)
        return AsyncChatStream(self.inference.ChatStream(request, **self._settings.call(rank, timeout)))

    async def server_info(
        self, timeout: float | None = None, *, rank: int | None = None
    ) -> control_pb2.GetServerInfoResponse:
        """The serving engine's version, parallelism (its dp rank among them) and cache geometry."""
        request = control_pb2.GetServerInfoRequest()
        try:
            return await self.control.GetServerInfo(request, **self._settings.call(rank, timeout))
        except grpc.RpcError as error:
            raise DpgateError.from_rpc_error(error) from None
