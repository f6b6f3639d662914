"""dpgate.v1 answers -> OpenAI response objects and stream chunks.

Unary: `chat_completion` builds a `chat.completion` from one ChatResponse per choice,
`text_completion` a `text_completion` from GenerateResponses. Streamed: a `ChatChunks` or
`CompletionChunks` per choice turns each stream message into the chunk dicts to send, and
`usage` sums what the finishes said. `json_bytes` is the text every answer and event is sent as.

Tokens in logprobs are the text and bytes the engine sends beside each id (the gateway holds no
tokenizer of its own). An engine too old to send them leaves both empty; the token is then written
`token_id:N` (vLLM's `return_tokens_as_token_ids` form), which still names it exactly.

`prompt_tokens_details.cached_tokens` is read from `FinishInfo.num_cached_prompt_tokens` when the
schema has that field (the prefix cache adds it): until then usage has no details, rather than a
made-up 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from dpgate.v1 import generate_pb2

_FINISH_REASONS: Final = {
    generate_pb2.FINISH_REASON_LENGTH: "length",
    generate_pb2.FINISH_REASON_STOP: "stop",
    generate_pb2.FINISH_REASON_ABORTED: "abort",
}
_CACHED_FIELD: Final = "num_cached_prompt_tokens"
HAS_CACHED_TOKENS: Final = _CACHED_FIELD in generate_pb2.FinishInfo.DESCRIPTOR.fields_by_name


# Compact, and UTF-8 as it is (no \u escapes). One encoder for every answer: json.dumps with
# options builds a new JSONEncoder each call.
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def json_bytes(body: Any) -> bytes:
    """An answer's JSON text, encoded as it goes out."""
    return _ENCODER.encode(body).encode()


Entry = generate_pb2.TokenLogprob | generate_pb2.TopLogprob


def token_name(entry: Entry) -> str:
    if entry.token or entry.token_bytes:
        return entry.token
    return f"token_id:{entry.token_id}"


def token_bytes(entry: Entry) -> list[int] | None:
    return list(entry.token_bytes) if entry.token or entry.token_bytes else None


def finish_reason(finish: generate_pb2.FinishInfo, has_tool_calls: bool = False) -> str | None:
    reason = _FINISH_REASONS.get(finish.reason)
    if reason == "stop" and has_tool_calls:
        return "tool_calls"
    return reason


def stop_reason(finish: generate_pb2.FinishInfo) -> int | str | None:
    """vLLM's `stop_reason`: the stop string or stop token that matched, when one did."""
    kind = finish.WhichOneof("matched_stop")
    return getattr(finish, kind) if kind is not None else None


def usage(prompt_finishes: Sequence[generate_pb2.FinishInfo], finishes: Sequence[generate_pb2.FinishInfo]) -> dict:
    """Usage of a request: prompts counted once each (`prompt_finishes`: one per prompt), outputs all."""
    prompt_tokens = sum(finish.num_prompt_tokens for finish in prompt_finishes)
    completion_tokens = sum(finish.num_generated_tokens for finish in finishes)
    result: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if HAS_CACHED_TOKENS:
        cached = sum(getattr(finish, _CACHED_FIELD) for finish in prompt_finishes)
        result["prompt_tokens_details"] = {"cached_tokens": cached}
    return result


def running_usage(num_prompt_tokens: int, num_generated_tokens: int) -> dict:
    total = num_prompt_tokens + num_generated_tokens
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_generated_tokens, "total_tokens": total}


# --- logprobs ---------------------------------------------------------------------------------


def chat_logprobs(logprobs: Sequence[generate_pb2.TokenLogprob]) -> list[dict]:
    """OpenAI chat `logprobs.content` entries."""
    return [
        {
            "token": token_name(entry),
            "logprob": entry.logprob,
            "bytes": token_bytes(entry),
            "top_logprobs": [
                {"token": token_name(top), "logprob": top.logprob, "bytes": token_bytes(top)}
                for top in entry.top_logprobs
            ],
        }
        for entry in logprobs
    ]


def completion_logprobs(logprobs: Sequence[generate_pb2.TokenLogprob], text_start: int = 0) -> dict:
    """OpenAI completions `logprobs`; `text_offset` counts characters of the choice's text from
    `text_start` (where this chunk's text begins), token texts laid end to end."""
    offsets = []
    for entry in logprobs:
        offsets.append(text_start)
        text_start += len(token_name(entry))
    return {
        "tokens": [token_name(entry) for entry in logprobs],
        "token_logprobs": [entry.logprob for entry in logprobs],
        "top_logprobs": [{token_name(top): top.logprob for top in entry.top_logprobs} for entry in logprobs],
        "text_offset": offsets,
    }


# --- unary ------------------------------------------------------------------------------------


def tool_call(call: generate_pb2.ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def chat_completion(
    request_id: str, model: str, created: int, answers: Sequence[generate_pb2.ChatResponse], logprobs: bool
) -> dict:
    choices = []
    for index, answer in enumerate(answers):
        message: dict[str, Any] = {"role": "assistant", "content": answer.content or None}
        if answer.reasoning_content:
            message["reasoning_content"] = answer.reasoning_content
        if answer.tool_calls:
            message["tool_calls"] = [tool_call(call) for call in answer.tool_calls]
        elif answer.content == "":
            message["content"] = ""
        choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": {"content": chat_logprobs(answer.logprobs)} if logprobs else None,
                "finish_reason": finish_reason(answer.finish, bool(answer.tool_calls)),
                "stop_reason": stop_reason(answer.finish),
            }
        )
    finishes = [answer.finish for answer in answers]
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(finishes[:1], finishes),
    }


def text_completion(
    request_id: str, model: str, created: int, answers: Sequence[generate_pb2.GenerateResponse], n: int, logprobs: bool
) -> dict:
    choices = [
        {
            "index": index,
            "text": answer.text,
            "logprobs": completion_logprobs(answer.logprobs) if logprobs else None,
            "finish_reason": finish_reason(answer.finish),
            "stop_reason": stop_reason(answer.finish),
        }
        for index, answer in enumerate(answers)
    ]
    finishes = [answer.finish for answer in answers]
    return {
        "id": f"cmpl-{request_id}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(finishes[::n], finishes),
    }


# --- streamed ---------------------------------------------------------------------------------


class ChatChunks:
    """One choice of a streamed chat: each ChatStreamResponse -> the `choices` entries to send."""

    __slots__ = ("finish", "index", "logprobs", "num_generated_tokens", "num_prompt_tokens", "num_tool_calls")

    def __init__(self, index: int, logprobs: bool) -> None:
        self.index = index
        self.logprobs = logprobs
        self.num_tool_calls = 0
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.finish: generate_pb2.FinishInfo | None = None

    def usage_so_far(self) -> dict:
        """vLLM's continuous usage: this choice's counts up to the chunk being sent."""
        return running_usage(self.num_prompt_tokens, self.num_generated_tokens)

    def feed(self, payload: bytes) -> list[dict]:
        message = generate_pb2.ChatStreamResponse.FromString(payload)
        event = message.WhichOneof("event")
        if event == "prompt_info":
            self.num_prompt_tokens = len(message.prompt_info.prompt_token_ids)
            return [self._choice({"role": "assistant", "content": ""})]
        if event == "finish":
            self.finish = message.finish
            return [self._choice({}, finish_reason(message.finish, self.num_tool_calls > 0), message.finish)]
        if event != "delta":
            return []
        delta = message.delta
        self.num_generated_tokens += len(delta.token_ids)
        kind = delta.WhichOneof("kind")
        if kind == "content":
            body: dict[str, Any] = {"content": delta.content}
        elif kind == "reasoning_content":
            body = {"reasoning_content": delta.reasoning_content}
        elif kind == "tool_call":
            body = {"tool_calls": [{"index": self.num_tool_calls, **tool_call(delta.tool_call)}]}
            self.num_tool_calls += 1
        elif self.logprobs and delta.logprobs:
            body = {}  # tokens that were only markup: their logprobs still go out
        else:
            return []
        choice = self._choice(body)
        if self.logprobs:
            choice["logprobs"] = {"content": chat_logprobs(delta.logprobs)}
        return [choice]

    def _choice(self, delta: dict, reason: str | None = None, finish: generate_pb2.FinishInfo | None = None) -> dict:
        choice: dict[str, Any] = {"index": self.index, "delta": delta, "logprobs": None, "finish_reason": reason}
        if finish is not None:
            choice["stop_reason"] = stop_reason(finish)
        return choice


class CompletionChunks:
    """One choice of a streamed completion: each GenerateStreamResponse -> `choices` entries."""

    __slots__ = ("finish", "index", "logprobs", "num_generated_tokens", "num_prompt_tokens", "text_length")

    def __init__(self, index: int, logprobs: bool) -> None:
        self.index = index
        self.logprobs = logprobs
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.text_length = 0  # characters streamed so far: where the next chunk's text_offset starts
        self.finish: generate_pb2.FinishInfo | None = None

    def usage_so_far(self) -> dict:
        return running_usage(self.num_prompt_tokens, self.num_generated_tokens)

    def feed(self, payload: bytes) -> list[dict]:
        message = generate_pb2.GenerateStreamResponse.FromString(payload)
        event = message.WhichOneof("event")
        if event == "prompt_info":
            self.num_prompt_tokens = len(message.prompt_info.prompt_token_ids)
        if event == "delta":
            delta = message.delta
            self.num_generated_tokens += len(delta.token_ids)
            logprobs = completion_logprobs(delta.logprobs, self.text_length) if self.logprobs else None
            self.text_length += len(delta.text)
            return [{"index": self.index, "text": delta.text, "logprobs": logprobs, "finish_reason": None}]
        if event == "finish":
            self.finish = message.finish
            reason = finish_reason(message.finish)
            stop = stop_reason(message.finish)
            return [{"index": self.index, "text": "", "logprobs": None, "finish_reason": reason, "stop_reason": stop}]
        return []
