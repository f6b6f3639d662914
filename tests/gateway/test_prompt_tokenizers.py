"""PromptTokenizers keeps, beside each engine tokenizer, the engine's chat template built from what
GetTokenizer hands over, and turns a Chat request into the ids of the prompt the engine renders;
in milliseconds, on a word-level tokenizer made here."""

from __future__ import annotations

import asyncio

import pytest
import tokenizers
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from dpgate.chat.request import chat_inputs, render_chat
from dpgate.invalid_request import InvalidRequestError
from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import generate_pb2 as pb
from gateway.prompt_tokenizers import PromptTokenizers

TEMPLATE = (
    "{{ bos_token }} {% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
VOCAB = ["[UNK]", "BOS", "[", "]", "system", "user", "assistant", "hello", "there", "{"]


def answer(**markers) -> cpb.GetTokenizerResponse:
    model = WordLevel({word: i for i, word in enumerate(VOCAB)}, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = Whitespace()
    return cpb.GetTokenizerResponse(
        tokenizer_json=tokenizer.to_str().encode(),
        chat_template=TEMPLATE,
        fingerprint="f" * 64,
        chat_special_tokens={"bos_token": "BOS"},
        **markers,
    )


MARKERS = {
    "reasoning_start": "<think>",
    "reasoning_end": "</think>",
    "tool_call_start": "<tc>",
    "tool_call_end": "</tc>",
}


def learned(response: cpb.GetTokenizerResponse) -> PromptTokenizers:
    prompts = PromptTokenizers()

    async def fetch():
        return response

    assert asyncio.run(prompts.learn(response.fingerprint, fetch))
    return prompts


def test_a_chat_request_becomes_the_ids_of_the_prompt_the_engine_renders():
    prompts = learned(answer(**MARKERS))
    assert prompts.renders_chat("f" * 64)
    request = pb.ChatRequest(messages=[pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="hello there")])
    text = render_chat(prompts.chat_templates["f" * 64], chat_inputs(request)).text
    assert text == "BOS [user] hello there [assistant]"
    assert list(prompts.encode_chat("f" * 64, request).ids) == [1, 2, 5, 3, 7, 8, 2, 6, 3]  # no special tokens added


def test_a_request_the_engine_would_refuse_raises_its_error_so_the_call_is_routed_by_load():
    prompts = learned(answer(**MARKERS))
    with pytest.raises(InvalidRequestError, match="messages must hold at least one message"):
        prompts.encode_chat("f" * 64, pb.ChatRequest())
    bad_tool = pb.ChatRequest(
        messages=[pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="hello")], tools=[pb.Tool(name="t", parameters="{")]
    )
    with pytest.raises(InvalidRequestError, match=r"tools\[0\].parameters is not valid JSON"):
        prompts.encode_chat("f" * 64, bad_tool)


def test_without_the_markers_chat_is_not_rendered_rather_than_guessed():
    prompts = learned(answer())
    assert prompts.knows("f" * 64) and not prompts.renders_chat("f" * 64)
