"""A 50-request Chat corpus for the gateway's prompt hashes and its routing: conversations that
grow turn by turn (so later requests share the earlier turns' prefix), system prompts, tools, past
tool calls and results, earlier reasoning, thinking switches, salts and non-ASCII text."""

from __future__ import annotations

import json
import random

from google.protobuf import struct_pb2

from dpgate.v1 import generate_pb2 as pb

ROLES = {"system": pb.CHAT_ROLE_SYSTEM, "user": pb.CHAT_ROLE_USER, "assistant": pb.CHAT_ROLE_ASSISTANT}
WORDS = [
    "route",
    "cache",
    "engine",
    "gateway",
    "token",
    "block",
    "prefix",
    "salt",
    "tenant",
    "answer",
    "question",
    "Paris",
    "Zürich",
    "naïve",
    "café",
    "東京",
    "データ",
    "🙂",
    "def",
    "return",
    "{}",
    "[]",
    "12345",
    "3.14",
    "--",
    "###",
    "<tool_call>",
    "</think>",
    "\n",
    "indent",
]
WEATHER = pb.Tool(
    name="get_weather",
    description="The weather in a city",
    parameters=json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
CLOCK = pb.Tool(name="get_time", description="Die Uhrzeit in einer Zeitzone", parameters="")


def message(role: str, content: str, **fields) -> pb.ChatMessage:
    return pb.ChatMessage(role=ROLES[role], content=content, **fields)


def chat_request(messages, tools=(), salt: str = "", kwargs: dict | None = None) -> pb.ChatRequest:
    stopping = pb.StoppingCriteria(max_tokens=1, ignore_eos=True)
    request = pb.ChatRequest(messages=messages, tools=list(tools), cache_salt=salt, stopping=stopping)
    if kwargs is not None:
        struct = struct_pb2.Struct()
        struct.update(kwargs)
        request.chat_template_kwargs.CopyFrom(struct)
    return request


def chat_corpus(seed: int) -> list[pb.ChatRequest]:
    """50 requests: 10 conversations of 5 turns each, sent turn by turn, interleaved."""
    rng = random.Random(seed)

    def sentence(low: int, high: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(low, high)))

    conversations = []
    for c in range(10):
        history = [message("system", f"System {c}: " + sentence(40, 120))] if c % 3 else []
        tools = [WEATHER, CLOCK] if c % 4 == 1 else ([WEATHER] if c % 4 == 2 else [])
        salt = f"salt-{c % 3}" if c % 2 else ""
        kwargs = [None, {"enable_thinking": False}, {"reasoning_effort": "none"}, {"thinking": True}][c % 4]
        turns = []
        for t in range(5):
            history.append(message("user", sentence(8, 60)))
            turns.append(chat_request(list(history), tools, salt, kwargs))
            if tools and t == 1:
                call = pb.ToolCall(id=f"call_{c}", name="get_weather", arguments=json.dumps({"city": "Zürich"}))
                history.append(message("assistant", "", tool_calls=[call]))
                history.append(pb.ChatMessage(role=pb.CHAT_ROLE_TOOL, content='{"temp": -3}', tool_call_id=f"call_{c}"))
            else:
                reasoning = sentence(3, 10) if t == 2 else ""
                history.append(message("assistant", sentence(5, 40), reasoning_content=reasoning))
        conversations.append(turns)
    ordered = [conversation[t] for t in range(5) for conversation in conversations]
    assert len(ordered) == 50
    return ordered
