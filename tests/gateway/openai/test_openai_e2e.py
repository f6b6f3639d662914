"""The OpenAI HTTP API end to end, read by the official `openai` package (sync and async clients).

One real SmolLM2 engine behind a real `dpgate gateway --http-port 0 --api-key ...`, over sockets:
completions and chat, streamed and not, n=2, logprobs, tools under auto, required and a named tool
(arguments validated with jsonschema), response_format json_schema (validated), a seed giving the
same text twice, a client that goes away mid-stream (the engine's load back to idle), every error
status through the package's exception types, and the same request over HTTP and over gRPC giving
the same token ids and logprobs.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import jsonschema
import openai
import pytest

from dpgate.ports import free_port
from dpgate.v1 import generate_pb2 as pb
from tests.support.gateway_processes import FAST_HEALTH, EngineProcess, GatewayProcess, inference_stub
from tests.support.health import poll_until_http_ok

KEY = "test-key"
AUTH = (("authorization", f"Bearer {KEY}"),)
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
}
TIME_SCHEMA = {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}


def tool(name: str, description: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


TOOLS = [tool("get_weather", "Weather in a city", WEATHER_SCHEMA), tool("get_time", "Time in a timezone", TIME_SCHEMA)]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    log_dir = tmp_path_factory.mktemp("openai-e2e")
    engine = EngineProcess(Path("smollm2-135m-instruct"), 0, 1, log_dir)
    engine.start()
    try:
        engine.wait_serving()
        gateway = GatewayProcess([engine.address], *FAST_HEALTH, "--http-port", "0", "--api-key", KEY, log_dir=log_dir)
        try:
            # GetServerInfo would need the key: /health is open
            poll_until_http_ok(f"http://127.0.0.1:{gateway.http_port}/health", None, "the gateway", 30, 0.05)
            yield engine, gateway, log_dir
        finally:
            gateway.stop()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def base_url(served) -> str:
    return f"http://127.0.0.1:{served[1].http_port}/v1"


@pytest.fixture(scope="module")
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)


def call_arguments(call) -> dict:
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def test_models_lists_the_engines_model(client):
    assert [model.id for model in client.models.list()] == ["smollm2-135m-instruct"]


def test_a_chat_answer_unary_and_streamed_agree(client):
    answer = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=CAPITAL, temperature=0, max_tokens=12
    )
    choice = answer.choices[0]
    assert "Paris" in choice.message.content and choice.finish_reason in ("stop", "length")
    assert answer.usage.completion_tokens <= 12 and answer.usage.prompt_tokens > 5
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=CAPITAL, temperature=0, max_tokens=12, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == choice.message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == answer.usage.completion_tokens


def test_completions_with_two_choices_and_logprobs(client):
    answer = client.completions.create(
        model="", prompt="The capital of France is", max_tokens=6, n=2, seed=3, logprobs=2
    )
    assert [choice.index for choice in answer.choices] == [0, 1]
    for choice in answer.choices:
        assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) <= 6
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
    assert answer.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in answer.choices)
    stream = client.completions.create(model="", prompt="The capital of France is", max_tokens=6, n=2, stream=True)
    by_choice: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            by_choice[choice.index] = by_choice.get(choice.index, "") + choice.text
    assert sorted(by_choice) == [0, 1]


def test_chat_logprobs_name_each_token(client):
    answer = client.chat.completions.create(
        model="", messages=CAPITAL, temperature=0, max_tokens=5, logprobs=True, top_logprobs=3
    )
    entries = answer.choices[0].logprobs.content
    assert len(entries) == answer.usage.completion_tokens
    assert "".join(entry.token for entry in entries) == answer.choices[0].message.content
    for entry in entries:
        assert entry.bytes == list(entry.token.encode()) and len(entry.top_logprobs) == 3
        assert all(top.bytes == list(top.token.encode()) for top in entry.top_logprobs)
        assert entry.logprob <= 0 and entry.top_logprobs[0].logprob >= entry.logprob - 1e-6


def test_a_required_tool_call_without_max_tokens_ends_after_the_call(client):
    """The issue's case: no max_tokens (chat's default is the rest of the context) and REQUIRED."""
    answer = client.chat.completions.create(
        model="", messages=ASK_WEATHER, tools=TOOLS, tool_choice="required", temperature=0
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls and all(call_arguments(call) for call in choice.message.tool_calls)


def test_a_named_tool_and_one_call_only(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    answer = client.chat.completions.create(
        model="", messages=ASK_WEATHER, tools=TOOLS, tool_choice=named, temperature=0
    )
    (call,) = answer.choices[0].message.tool_calls
    assert call.function.name == "get_time" and "timezone" in call_arguments(call)
    single = client.chat.completions.create(
        model="", messages=ASK_WEATHER, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0.8,
        seed=5,
    )  # fmt: skip
    assert len(single.choices[0].message.tool_calls) == 1


def test_tools_under_auto_give_valid_calls_or_clean_content(client):
    answer = client.chat.completions.create(model="", messages=ASK_WEATHER, tools=TOOLS, temperature=0, max_tokens=60)
    message = answer.choices[0].message
    for call in message.tool_calls or []:
        call_arguments(call)
    assert "<tool_call>" not in (message.content or "") or answer.choices[0].finish_reason == "length"


def test_a_streamed_required_tool_call(client):
    stream = client.chat.completions.create(
        model="", messages=ASK_WEATHER, tools=TOOLS, tool_choice="required", temperature=0, stream=True
    )
    calls = [call for chunk in stream for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices]
    assert calls and [call.index for call in calls] == list(range(len(calls)))
    assert all(call_arguments(call) for call in calls)


def test_response_format_json_schema_is_followed(client):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "likes_cats": {"type": "boolean"},
            "city": {"enum": ["Paris", "Rome", "Oslo"]},
        },
        "required": ["name", "likes_cats", "city"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "Invent a person."}], max_tokens=200, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}},
    )  # fmt: skip
    assert answer.choices[0].finish_reason == "stop", answer.choices[0].message.content
    jsonschema.validate(json.loads(answer.choices[0].message.content), schema)


def test_a_seed_gives_the_same_text_twice(client):
    def sample() -> str:
        answer = client.chat.completions.create(model="", messages=CAPITAL, temperature=1.0, seed=1234, max_tokens=16)
        return answer.choices[0].message.content

    assert sample() == sample()


def test_the_async_client_streams_chat(base_url):
    async def run() -> str:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="", messages=CAPITAL, temperature=0, max_tokens=8, stream=True
            )
            return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

    assert "Paris" in asyncio.run(run())


def test_a_client_that_leaves_mid_stream_frees_the_engine(served, client):
    engine = served[0]
    stream = client.chat.completions.create(
        model="", messages=CAPITAL, max_tokens=400, stream=True, extra_body={"ignore_eos": True}
    )
    for index, _ in enumerate(stream):
        if index == 3:
            break
    assert engine.load().num_running == 1
    stream.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        load = engine.load()
        if load.num_running == 0 and load.num_waiting == 0:
            break
        time.sleep(0.05)
    assert (load.num_running, load.num_waiting) == (0, 0)


def test_the_same_request_over_http_and_grpc_gives_the_same_tokens_and_logprobs(served, client):
    answer = client.completions.create(
        model="", prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=2
    )
    http = answer.choices[0].logprobs
    with grpc.insecure_channel(served[1].address) as channel:
        reply = inference_stub(channel).Generate(
            pb.GenerateRequest(
                text="The capital of France is", sampling=pb.SamplingParams(temperature=0),
                stopping=pb.StoppingCriteria(max_tokens=8), logprobs=pb.LogprobsOptions(top_n=2),
            ),
            metadata=AUTH, timeout=120,
        )  # fmt: skip
    assert [entry.token_id for entry in reply.logprobs] == list(reply.token_ids)
    assert http.tokens == [entry.token for entry in reply.logprobs] and "".join(http.tokens) == reply.text
    assert http.token_logprobs == [entry.logprob for entry in reply.logprobs]
    assert http.top_logprobs == [{top.token: top.logprob for top in entry.top_logprobs} for entry in reply.logprobs]
    chat = client.chat.completions.create(model="", messages=CAPITAL, temperature=0, max_tokens=8, logprobs=True)
    with grpc.insecure_channel(served[1].address) as channel:
        reply = inference_stub(channel).Chat(
            pb.ChatRequest(
                messages=[pb.ChatMessage(role=pb.CHAT_ROLE_USER, content=CAPITAL[0]["content"])],
                sampling=pb.SamplingParams(temperature=0), stopping=pb.StoppingCriteria(max_tokens=8),
                logprobs=pb.LogprobsOptions(),
            ),
            metadata=AUTH, timeout=120,
        )  # fmt: skip
    entries = chat.choices[0].logprobs.content
    assert [entry.token for entry in entries] == [entry.token for entry in reply.logprobs]
    assert [entry.logprob for entry in entries] == [entry.logprob for entry in reply.logprobs]
    assert chat.choices[0].message.content == reply.content


# --- errors, through the package's exception types --------------------------------------------


def test_a_bad_field_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="", messages=CAPITAL, extra_body={"best_of": 2})
    assert info.value.status_code == 400 and "best_of is not supported" in info.value.message
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="", messages=CAPITAL, temperature=-1, max_tokens=2)


def test_a_malformed_rank_header_is_a_400_with_the_grpc_sentence(client):
    with pytest.raises(
        openai.BadRequestError, match="x-data-parallel-rank metadata must be an unsigned 32-bit integer"
    ):
        client.completions.create(model="", prompt="a", max_tokens=1, extra_headers={"x-data-parallel-rank": "-1"})
    answer = client.completions.create(model="", prompt="a", max_tokens=1, extra_headers={"x-data-parallel-rank": "0"})
    assert answer.choices[0].finish_reason == "length"


def test_a_missing_or_wrong_key_is_a_401(base_url):
    wrong = openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model="", prompt="a", max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_an_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="gpt-4o", messages=CAPITAL, max_tokens=2)


def test_a_full_gateway_is_a_429_with_retry_after(served, base_url):
    engine, _, log_dir = served
    gateway = GatewayProcess(
        [engine.address], *FAST_HEALTH, "--http-port", "0", "--max-in-flight", "1", log_dir=log_dir, name="full"
    )
    try:
        gateway.wait_ranks([0])
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway.http_port}/v1", api_key="none", max_retries=0)
        stream = client.completions.create(
            model="", prompt="a", max_tokens=300, stream=True, extra_body={"ignore_eos": True}
        )
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model="", prompt="a", max_tokens=1)
        assert info.value.response.headers["retry-after"] == "1"
        stream.close()
    finally:
        gateway.stop()


def test_no_engine_is_a_503(served):
    log_dir = served[2]
    gateway = GatewayProcess(
        [f"127.0.0.1:{free_port()}"], *FAST_HEALTH, "--http-port", "0", log_dir=log_dir, name="empty"
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway.http_port}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model="", prompt="a", max_tokens=1)
        assert info.value.status_code == 503 and info.value.response.headers["retry-after"] == "1"
    finally:
        gateway.stop()
