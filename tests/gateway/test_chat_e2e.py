"""Chat and ChatStream end to end: real `dpgate engine` processes and a real gateway, over sockets.

One SmolLM2 engine (the default model, its chat template from the GGUF) behind one gateway serves
the module: a plain answer, unary and streaming agreeing on a seeded request, a weather tool called
under tool_choice REQUIRED with arguments that validate against the tool's schema, a named tool,
cancellation reaching the engine. A tiny model stripped of its template shows the refusal, and the
session's DP-2 tiny deployment shows rank pinning.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import jsonschema
import pytest

from dpgate.v1 import generate_pb2 as pb
from engines.grammar.spec import ebnf_literal
from tests.support.gateway_processes import FAST_HEALTH, RANK_KEY, EngineProcess, GatewayProcess, inference_stub
from tests.tiny_model import make_tiny_llama_dir

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
}
WEATHER = pb.Tool(
    name="get_weather", description="Get the current weather in a city", parameters=json.dumps(WEATHER_SCHEMA)
)
TIME_SCHEMA = {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}
CLOCK = pb.Tool(name="get_time", description="Get the current time in a timezone", parameters=json.dumps(TIME_SCHEMA))
GREEDY = pb.SamplingParams(temperature=0.0)
# A Qwen3-like template whose default is thinking on: the prompt opens <think>, or, with thinking
# opted out, closes an empty block.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
)
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def user(text: str) -> pb.ChatMessage:
    return pb.ChatMessage(role=pb.CHAT_ROLE_USER, content=text)


def stream_of(request: pb.ChatRequest) -> pb.ChatStreamRequest:
    return pb.ChatStreamRequest.FromString(request.SerializeToString())


def named(calls) -> list[tuple[str, str]]:
    """Calls without their ids: ids are made from the request id, which differs between two calls."""
    return [(call.name, call.arguments) for call in calls]


def joined(messages: list[pb.ChatStreamResponse]) -> tuple[str, str, list[pb.ToolCall], list[int]]:
    deltas = [m.delta for m in messages if m.HasField("delta")]
    content = "".join(d.content for d in deltas if d.WhichOneof("kind") == "content")
    reasoning = "".join(d.reasoning_content for d in deltas if d.WhichOneof("kind") == "reasoning_content")
    calls = [d.tool_call for d in deltas if d.WhichOneof("kind") == "tool_call"]
    return content, reasoning, calls, [t for d in deltas for t in d.token_ids]


class FlaggedEngine(EngineProcess):
    """Rank 0 of 1 on `model`, with extra engine flags."""

    def __init__(self, model: Path, log_dir: Path, *flags: str) -> None:
        super().__init__(model, 0, 1, log_dir)
        self.flags = flags

    def command(self) -> list[str]:
        return [*super().command(), *self.flags]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chat-e2e")


@pytest.fixture(scope="module")
def no_template_engine(chat_dir: Path):
    """The tiny Llama with its chat template removed from its tokenizer files."""
    model_dir = make_tiny_llama_dir(chat_dir / "no-template")
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    log_dir = chat_dir / "no-template-logs"
    log_dir.mkdir()
    engine = EngineProcess(model_dir, 0, 1, log_dir)
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def thinking_engine(chat_dir: Path):
    """The tiny Llama with THINKING_TEMPLATE as its --chat-template; its (random) output is forced
    with structured_output, so the parsing of a known text is checked through the whole path."""
    template = chat_dir / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    log_dir = chat_dir / "thinking-logs"
    log_dir.mkdir()
    engine = FlaggedEngine(make_tiny_llama_dir(chat_dir / "thinking"), log_dir, "--chat-template", str(template))
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def smollm2(chat_dir: Path, no_template_engine: EngineProcess, thinking_engine: EngineProcess):
    engine = FlaggedEngine(Path("smollm2-135m-instruct"), chat_dir)
    engine.start()  # all engines load at once
    try:
        engine.wait_serving()
        gateway = GatewayProcess([engine.address], *FAST_HEALTH, log_dir=chat_dir)
        try:
            gateway.wait_ranks([0])
            yield engine, gateway
        finally:
            gateway.stop()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def stub(smollm2):
    with grpc.insecure_channel(smollm2[1].address) as channel:
        yield inference_stub(channel)


def test_a_plain_chat_gets_an_answer_through_the_gateway(stub):
    request = pb.ChatRequest(
        messages=[user("What is the capital of France?")],
        sampling=GREEDY,
        stopping=pb.StoppingCriteria(max_tokens=24),
    )
    response, call = stub.Chat.with_call(request, timeout=60)
    assert "Paris" in response.content
    assert response.reasoning_content == "" and not response.tool_calls
    assert "<|im_end|>" not in response.content and "<|im_start|>" not in response.content
    assert response.request_id and response.finish.num_generated_tokens == len(response.token_ids)
    assert response.finish.reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    assert dict(call.trailing_metadata())[RANK_KEY] == "0"


def test_chat_stream_and_chat_agree_on_a_seeded_request(stub):
    request = pb.ChatRequest(
        messages=[user("What's the weather like in Paris today? Answer or call a tool.")],
        tools=[WEATHER],
        sampling=pb.SamplingParams(temperature=0.8, seed=11),
        stopping=pb.StoppingCriteria(max_tokens=48),
        logprobs=pb.LogprobsOptions(top_n=1),
    )
    unary = stub.Chat(request, timeout=60)
    messages = list(stub.ChatStream(stream_of(request), timeout=60))
    assert messages[0].WhichOneof("event") == "prompt_info" and messages[-1].WhichOneof("event") == "finish"
    assert all(m.WhichOneof("event") == "delta" for m in messages[1:-1])
    content, reasoning, calls, token_ids = joined(messages)
    assert (content, reasoning, named(calls)) == (unary.content, unary.reasoning_content, named(unary.tool_calls))
    assert token_ids == list(unary.token_ids)
    deltas = [m.delta for m in messages[1:-1]]
    assert sum(len(d.logprobs) for d in deltas) == len(token_ids)
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
    # The stream ran second, its prompt from the prefix cache (the same bits as cold); the rest agrees.
    streamed = pb.FinishInfo()
    streamed.CopyFrom(messages[-1].finish)
    assert streamed.num_cached_prompt_tokens > unary.finish.num_cached_prompt_tokens
    streamed.num_cached_prompt_tokens = unary.finish.num_cached_prompt_tokens
    assert streamed == unary.finish
    assert all(d.WhichOneof("kind") is not None or d.token_ids for d in deltas)  # a kind-less delta carries tokens


def test_tool_choice_required_returns_a_call_whose_arguments_follow_the_schema(stub):
    request = pb.ChatRequest(
        messages=[user("What is the weather in Paris, in celsius?")],
        tools=[WEATHER],
        tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED),
        sampling=GREEDY,
        stopping=pb.StoppingCriteria(max_tokens=96),
    )
    response = stub.Chat(request, timeout=60)
    assert response.finish.reason == pb.FINISH_REASON_STOP, response
    assert response.tool_calls, response
    assert response.content == ""
    for call in response.tool_calls:
        assert call.name == "get_weather" and call.id
        jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    streamed = list(stub.ChatStream(stream_of(request), timeout=60))
    assert named(joined(streamed)[2]) == named(response.tool_calls)


def test_a_named_tool_choice_calls_that_tool(stub):
    request = pb.ChatRequest(
        messages=[user("What is the weather in Tokyo?")],
        tools=[WEATHER, CLOCK],
        tool_choice=pb.ToolChoice(tool_name="get_time"),
        sampling=GREEDY,
        stopping=pb.StoppingCriteria(max_tokens=96),
    )
    response = stub.Chat(request, timeout=60)
    assert [call.name for call in response.tool_calls][:1] == ["get_time"], response
    assert {call.name for call in response.tool_calls} == {"get_time"}
    for call in response.tool_calls:
        jsonschema.validate(json.loads(call.arguments), TIME_SCHEMA)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "messages must hold at least one message"),
        (
            {"messages": [user("hi")], "tool_choice": pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)},
            "tool_choice REQUIRED needs at least one tool in tools",
        ),
        ({"messages": [pb.ChatMessage(content="hi")]}, "messages[0].role must be set"),
    ],
)
def test_bad_chat_requests_are_invalid_argument_through_the_gateway(stub, fields, message):
    with pytest.raises(grpc.RpcError) as info:
        stub.Chat(pb.ChatRequest(**fields), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(message)


def test_a_cancelled_chat_stream_stops_in_the_engine(stub, smollm2):
    engine = smollm2[0]
    request = pb.ChatStreamRequest(
        messages=[user("Write a long story about a lighthouse.")],
        stopping=pb.StoppingCriteria(max_tokens=2000, ignore_eos=True),
    )
    call = stub.ChatStream(request, timeout=60)
    for message in call:
        if message.WhichOneof("event") == "delta":
            break
    assert engine.load().num_running == 1
    call.cancel()
    deadline = time.monotonic() + 10
    while engine.load().num_running:
        assert time.monotonic() < deadline, "the engine kept generating after the client cancelled"
        time.sleep(0.05)


def test_a_model_without_a_chat_template_refuses_chat_saying_how_to_pass_one(no_template_engine, smollm2):
    no_template_engine.wait_serving()
    with grpc.insecure_channel(no_template_engine.address) as channel:
        stub = inference_stub(channel)
        for rpc, request in (("Chat", pb.ChatRequest), ("ChatStream", pb.ChatStreamRequest)):
            with pytest.raises(grpc.RpcError) as info:
                result = getattr(stub, rpc)(request(messages=[user("hi")]), timeout=30)
                list(result) if rpc == "ChatStream" else None
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert info.value.details() == "the model has no chat template; pass one with --chat-template FILE"
        stub.Generate(pb.GenerateRequest(text="hi", stopping=pb.StoppingCriteria(max_tokens=2)), timeout=30)


def test_chat_is_pinned_to_the_rank_the_client_names(gateway, engines):
    """The session's DP-2 tiny deployment (SmolLM2's template, random weights)."""
    request = pb.ChatRequest(messages=[user("hello")], stopping=pb.StoppingCriteria(max_tokens=3, ignore_eos=True))
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_stub(channel)
        for rank in ("1", "0", "1"):
            before = engines[int(rank)].requests_total().get("Chat", 0)
            response, call = stub.Chat.with_call(request, metadata=[(RANK_KEY, rank)], timeout=30)
            assert dict(call.trailing_metadata())[RANK_KEY] == rank
            assert len(response.token_ids) == 3
            assert engines[int(rank)].requests_total().get("Chat", 0) == before + 1
        stream = stub.ChatStream(stream_of(request), metadata=[(RANK_KEY, "1")], timeout=30)
        messages = list(stream)
        assert dict(stream.trailing_metadata())[RANK_KEY] == "1"
        assert len(joined(messages)[3]) == 3


def forced(text: str) -> pb.StructuredOutput:
    return pb.StructuredOutput(ebnf=f"root ::= {ebnf_literal(text)}")


@pytest.mark.parametrize(
    ("kwargs", "thinking"),
    [
        ({}, True),  # the template's default
        ({"enable_thinking": True}, True),
        ({"thinking": False}, False),
        ({"enable_thinking": None}, False),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "None"}, True),  # only the exact string opts out
    ],
)
def test_reasoning_then_a_tool_call_is_split_as_the_prompt_was_rendered(
    thinking_engine, smollm2, smollm2_tokenizer, kwargs, thinking
):
    """The model writes reasoning, `</think>`, then a call: with thinking on that is reasoning and
    one call, no content; opted out, the same output has no reasoning (the stray `</think>` is
    markup) and the prompt closed the empty block instead of opening one."""
    thinking_engine.wait_serving()
    text = "I should ask the weather tool.</think>\n\n" + CALL_TEXT
    # The grammar fixes the text, not its tokenization: sampled, the random model spelled it in
    # 66-78+ tokens, so a budget of 80 could cut the stream's copy short of `</tool_call>`. Greedy
    # makes the unary and the stream the same tokens; every token holds at least one character.
    request = pb.ChatRequest(
        messages=[user("Weather in Paris?")],
        tools=[WEATHER],
        structured_output=forced(text),
        sampling=GREEDY,
        stopping=pb.StoppingCriteria(max_tokens=len(text) + 1),
    )
    request.chat_template_kwargs.update(kwargs)
    with grpc.insecure_channel(thinking_engine.address) as channel:
        stub = inference_stub(channel)
        unary = stub.Chat(request, timeout=60)
        messages = list(stub.ChatStream(stream_of(request), timeout=60))
    prompt = smollm2_tokenizer.decode(messages[0].prompt_info.prompt_token_ids)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n" if thinking else "<think>\n\n</think>\n\n")
    assert [(c.name, c.arguments) for c in unary.tool_calls] == [("get_weather", '{"city":"Paris"}')]
    if thinking:
        assert (unary.reasoning_content, unary.content) == ("I should ask the weather tool.", "")
    else:
        assert (unary.reasoning_content, unary.content) == ("", "I should ask the weather tool.")
    content, reasoning, calls, _ = joined(messages)
    assert (content, reasoning, named(calls)) == (unary.content, unary.reasoning_content, named(unary.tool_calls))
    for message in messages[1:-1]:
        text = message.delta.content or message.delta.reasoning_content
        assert not any(marker in text for marker in ("<think>", "</think>", "<tool_call>", "</tool_call>"))
