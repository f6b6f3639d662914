"""Chat through the real front door: the blocking and asyncio clients against SmolLM2 behind a gateway.

A required tool call parses and validates against its tool's schema; the stream and the unary
call give the same turn for the same greedy request; a server's refusal arrives as DpgateError;
and cancelling a stream makes the engine stop the request (its load drops to nothing running and
its request log says CANCELLED) instead of generating on to max_tokens.
"""

from __future__ import annotations

import asyncio
import json
import time

import jsonschema
import pytest

from dpgate.client import (
    AsyncDpgateClient,
    ChatTool,
    ContentDelta,
    DpgateClient,
    DpgateError,
    GenerationOptions,
    ReasoningDelta,
    ToolCallItem,
)

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
}
WEATHER = ChatTool("get_weather", "Get the current weather in a city", WEATHER_SCHEMA)
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]
ASK_CAPITAL = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
GREEDY = GenerationOptions(max_tokens=48, temperature=0.0)


def test_a_required_tool_call_through_the_gateway_validates_against_the_tools_schema(smollm2_chat_server) -> None:
    with DpgateClient(smollm2_chat_server.gateway.address, timeout=120) as client:
        answer = client.chat(ASK_WEATHER, GREEDY, tools=[WEATHER], tool_choice="required")
    assert answer.tool_calls, answer
    for call in answer.tool_calls:
        assert call.name == "get_weather" and call.id
        jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    if answer.finish.reason == "stop":  # cut by max_tokens, an unclosed next call is content, never dropped
        assert "<tool_call>" not in answer.content
    assert answer.rank == 0 and answer.usage.prompt_tokens > 0


def _turn(content: str, reasoning: str, calls) -> tuple[str, str, tuple]:
    """A turn to compare across requests: call ids name their request, so only name and arguments."""
    assert len({call.id for call in calls}) == len(calls) and all(call.id for call in calls)
    return content, reasoning, tuple((call.name, call.arguments) for call in calls)


def _unary(answer) -> tuple[str, str, tuple]:
    return _turn(answer.content, answer.reasoning_content, answer.tool_calls)


def _fold(items) -> tuple[str, str, tuple]:
    content = "".join(item.text for item in items if isinstance(item, ContentDelta))
    reasoning = "".join(item.text for item in items if isinstance(item, ReasoningDelta))
    calls = tuple(item.tool_call for item in items if isinstance(item, ToolCallItem))
    return _turn(content, reasoning, calls)


@pytest.mark.parametrize(("messages", "choice"), [(ASK_CAPITAL, None), (ASK_WEATHER, "get_weather")])
def test_the_stream_and_the_unary_call_give_the_same_turn(smollm2_chat_server, messages, choice) -> None:
    arguments = {"tools": [WEATHER] if choice else [], "tool_choice": choice, "rank": 0}
    with DpgateClient(smollm2_chat_server.gateway.address, timeout=120) as client:
        answer = client.chat(messages, GREEDY, **arguments)
        with client.chat_stream(messages, GREEDY, **arguments) as stream:
            items = list(stream)
    assert _fold(items) == _unary(answer)
    assert stream.finish == answer.finish and stream.rank == answer.rank == 0
    assert stream.request_id and stream.prompt_token_ids
    assert (answer.content != "") if choice is None else (len(answer.tool_calls) >= 1)


def test_the_asyncio_client_gives_what_the_blocking_client_gives(smollm2_chat_server) -> None:
    address = smollm2_chat_server.gateway.address

    async def chat() -> tuple:
        async with AsyncDpgateClient(address, timeout=120, rank=0) as client:
            answer = await client.chat(ASK_WEATHER, GREEDY, tools=[WEATHER], tool_choice="required")
            items = [
                item async for item in client.chat_stream(ASK_WEATHER, GREEDY, tools=[WEATHER], tool_choice="required")
            ]
            return answer, items

    answer, items = asyncio.run(chat())
    with DpgateClient(address, timeout=120) as client:
        expected = client.chat(ASK_WEATHER, GREEDY, tools=[WEATHER], tool_choice="required")
    assert _unary(answer) == _unary(expected)
    assert _fold(items) == _unary(expected)


def test_a_refused_chat_is_a_dpgate_error_with_the_code_and_the_servers_message(smollm2_chat_server) -> None:
    with DpgateClient(smollm2_chat_server.gateway.address, timeout=60) as client:
        with pytest.raises(DpgateError) as refused:
            client.chat(ASK_WEATHER, GREEDY, tools=[WEATHER], tool_choice="get_time")
        assert refused.value.code.name == "INVALID_ARGUMENT" and "tool_choice" in refused.value.message
        with pytest.raises(DpgateError) as streamed, client.chat_stream(ASK_WEATHER, GREEDY, rank=7) as stream:
            list(stream)
        assert streamed.value.code.name != "OK" and str(streamed.value).startswith(streamed.value.code.name + ": ")


def wait_nothing_running(engine, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while (load := engine.load()).num_running or load.num_waiting:
        assert time.monotonic() < deadline, f"the engine still runs the cancelled request: {load}"
        time.sleep(0.05)


def test_cancelling_a_stream_stops_the_request_in_the_engine(smollm2_chat_server) -> None:
    story = [{"role": "user", "content": "Write a very long story about a dragon who learns to bake bread."}]
    options = GenerationOptions(max_tokens=2000, temperature=0.0, ignore_eos=True)
    with DpgateClient(smollm2_chat_server.gateway.address, timeout=120) as client:
        with client.chat_stream(story, options) as stream:
            received = [item for item, _ in zip(stream, range(8), strict=False)]
        assert len(received) == 8 and stream.finish is None  # left early: no finish seen
        wait_nothing_running(smollm2_chat_server.engine)
        # The engine is free again at once: a new answer is served.
        assert client.chat(ASK_CAPITAL, GenerationOptions(max_tokens=4, temperature=0.0)).finish.usage.completion_tokens
    log = smollm2_chat_server.engine.log_path.read_text()
    cancelled = [line for line in log.splitlines() if "ChatStream CANCELLED" in line]
    assert cancelled, log[-2000:]
    generated = int(cancelled[-1].split(" prompt tokens, ", 1)[1].split(" generated", 1)[0])
    assert generated < 2000
