"""Server-sent events for a streamed request: the choices' calls merged into one event stream.

Each choice's call is read by its own task into one bounded queue (so a slow client holds back
the engines, as the upstream windows are returned only as messages are taken). Nothing is sent
until every call has sent its first message (the engine's PromptInfo, after it accepted the
request) or ended: a call refused before that is answered as an HTTP error, not a broken stream.
After the 200, a call that fails sends one `data: {"error": ...}` event and the stream ends with
`data: [DONE]`; the other choices are cancelled.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from aiohttp import web

from dpgate.request_id import REQUEST_ID_KEY
from gateway.grpc_wire import ResponseStatus
from gateway.openai import responses
from gateway.openai.bridge import EngineCall
from gateway.openai.errors import error_for_status
from gateway.openai.translate import Plan

DONE = b"data: [DONE]\n\n"
_QUEUE_PER_CHOICE = 8
_ENDED = object()


def event(body: Any) -> bytes:
    return b"data: " + responses.json_bytes(body) + b"\n\n"


async def _read(index: int, call: EngineCall, queue: asyncio.Queue) -> None:
    while (payload := await call.next_message()) is not None:
        await queue.put((index, payload))
    await queue.put((index, _ENDED))


async def stream_choices(
    request: web.BaseRequest, calls: list[EngineCall], plan: Plan, kind: str, request_id: str, model: str
) -> web.StreamResponse:
    chunk_type = responses.ChatChunks if kind == "chat" else responses.CompletionChunks
    choices = [chunk_type(index, plan.logprobs) for index in range(len(calls))]
    head = {
        "id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{request_id}",
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": plan.created,
        "model": model,
    }
    queue: asyncio.Queue = asyncio.Queue(_QUEUE_PER_CHOICE * len(calls))
    readers = [asyncio.ensure_future(_read(index, call, queue)) for index, call in enumerate(calls)]
    try:
        held: list[tuple[int, Any]] = []
        started: set[int] = set()
        while len(started) < len(calls):  # wait for every call's first message (or its end)
            index, item = await queue.get()
            held.append((index, item))
            started.add(index)
            if item is _ENDED and calls[index].status.code is not grpc.StatusCode.OK:
                status = calls[index].status
                answer = error_for_status(status.code, status.message)
                return web.json_response(answer.body(), status=answer.status, headers=_headers(answer, request_id))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", REQUEST_ID_KEY: request_id}
        )
        await response.prepare(request)
        num_ended = 0
        failed: ResponseStatus | None = None
        pending = held
        while True:
            out = bytearray()
            for index, item in pending:
                if item is _ENDED:
                    num_ended += 1
                    status = calls[index].status
                    if status.code is not grpc.StatusCode.OK and failed is None:
                        failed = status
                    continue
                for choice in choices[index].feed(item):
                    if plan.continuous_usage:
                        out += event({**head, "choices": [choice], "usage": choices[index].usage_so_far()})
                    else:
                        out += event({**head, "choices": [choice]})
            if failed is not None or num_ended == len(calls):
                break
            if out:
                await response.write(bytes(out))
            pending = [await queue.get()]
            while not queue.empty():  # whatever else is ready goes out in the same write
                pending.append(queue.get_nowait())
        if failed is not None:
            assert failed.code is not None
            out += event(error_for_status(failed.code, failed.message).body())
        elif plan.include_usage:
            finishes = [choice.finish for choice in choices if choice.finish is not None]
            step = plan.n if kind == "completion" else len(calls)
            usage = responses.usage(finishes[::step], finishes)
            out += event({**head, "choices": [], "usage": usage})
        await response.write(bytes(out) + DONE)
        await response.write_eof()
        return response
    finally:
        for reader in readers:
            reader.cancel()


def _headers(answer: Any, request_id: str) -> dict[str, str]:
    return {**answer.headers(), REQUEST_ID_KEY: request_id}
