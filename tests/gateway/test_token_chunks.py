"""Encoding piece by piece gives the ids of encoding whole, on both packaged models' tokenizers:
SmolLM2's (cut at "<alnum> ", gateway/token_chunks.py) and Gemma 3's (no rule: encoded whole).
Random texts built to hit the regex's edges (digits, contractions, whitespace runs, non-ASCII,
special-token markup, cuts after letters, digits and punctuation), the gateway's test corpora,
and texts sharing prefixes so later ones are answered from the cache."""

from __future__ import annotations

import asyncio
import functools
import json
import random
from array import array

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from dpgate.v1 import control_pb2 as cpb
from gateway.bounded_lru import BoundedLru
from gateway.prompt_tokenizers import PromptTokenizers
from gateway.token_chunks import PIECE_CHARS, pieces, special_ids, split_rule
from tests.gateway.chat_corpus import WORDS as CHAT_WORDS
from tests.gateway.test_prompt_hashes_e2e import WORDS as PROMPT_WORDS
from tests.gateway.test_prompt_hashes_e2e import corpus

MODELS = {"smollm2": "smollm2-135m-instruct", "gemma3": "gemma3-270m"}
FRAGMENTS = [
    "a", "Z", "é", "東京", "データ", "🙂", "ß", "Ω", "7", "42", "3.14", "١٢٣", "²", "'s", "'t", "'re", "'ll", "n't",
    " ", "  ", "   ", "\n", "\n\n", "\t", " \n ", "\r\n", "\u00a0", "\u3000", "\u2028", ".", ",", "!?", "--", "{}",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<repo_name>",
    "()", "def", "return", "word", "Hello", " the", " cache", "x" * 40,
]  # fmt: skip


@functools.cache
def tokenizer_json(name: str) -> str:
    """What the engine hands over GetTokenizer for this packaged model."""
    from engines.model.source import resolve_model
    from engines.model.tokenizer import load_tokenizer

    return load_tokenizer(resolve_model(MODELS[name])).tokenizer.backend_tokenizer.to_str()


@pytest.fixture(scope="module", params=list(MODELS))
def model_tokenizer(request) -> tuple[str, PromptTokenizers, tokenizers.Tokenizer]:
    json_text = tokenizer_json(request.param)
    prompts = PromptTokenizers(BoundedLru(max_entries=2_000, max_bytes=1 << 20))

    async def fetch():
        return cpb.GetTokenizerResponse(tokenizer_json=json_text.encode(), fingerprint=request.param)

    assert asyncio.run(prompts.learn(request.param, fetch))
    return request.param, prompts, tokenizers.Tokenizer.from_str(json_text)


def whole(tokenizer: tokenizers.Tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


def test_only_smollm2_is_cut_and_its_template_adds_nothing(model_tokenizer):
    name, _prompts, tokenizer = model_tokenizer
    rule = split_rule(tokenizer)
    assert (rule is not None) is (name == "smollm2")
    if rule is not None:
        assert rule.prefix_ids == () and rule.suffix_ids == ()


def random_text(rng: random.Random, num_fragments: int) -> str:
    return "".join(rng.choice(FRAGMENTS) + rng.choice(["", " ", " ", "  "]) for _ in range(num_fragments))


def test_random_texts_encode_as_whole_texts_do_including_from_the_cache(model_tokenizer):
    name, prompts, tokenizer = model_tokenizer
    rng = random.Random(3)
    shared = random_text(rng, 400)
    for i in range(300):
        text = random_text(rng, rng.randrange(0, 600))
        if i % 3 == 0:
            text = shared + text  # later ones find the shared pieces in the cache
        ids = prompts.encode(name, text).ids
        assert isinstance(ids, array) and list(ids) == whole(tokenizer, text), text
        again = prompts.encode_mostly_cached(name, text, 0)  # all from the cache now
        assert again is None if name == "gemma3" else list(again.ids) == list(ids)
        fresh = text + " fresh words" * (i % 5)  # its last piece is new
        tail = prompts.encode_mostly_cached(name, fresh, 1 << 20)
        assert tail is None if name == "gemma3" else list(tail.ids) == whole(tokenizer, fresh)
    if name == "smollm2":
        assert len(prompts.piece_ids) > 100


def test_the_gateways_corpora_encode_as_whole_texts_do(model_tokenizer):
    name, prompts, tokenizer = model_tokenizer
    for text, _salt, _tenant in corpus(11) + corpus(12):
        assert list(prompts.encode(name, text).ids) == whole(tokenizer, text), text
    rng = random.Random(9)
    for _ in range(100):
        words = rng.choice([CHAT_WORDS, PROMPT_WORDS])
        text = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 800)))
        assert list(prompts.encode(name, text).ids) == whole(tokenizer, text), text


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=250).map("".join))
def test_any_text_encodes_as_whole_text_does(model_tokenizer, text):
    name, prompts, tokenizer = model_tokenizer
    assert list(prompts.encode(name, text).ids) == whole(tokenizer, text)
    assert list(prompts._encode(name, text, add_special_tokens=False).ids) == whole(tokenizer, text, False)


def test_pieces_cut_only_after_a_letter_or_digit_before_a_space_and_rejoin():
    rng = random.Random(1)
    for _ in range(200):
        text = random_text(rng, rng.randrange(0, 300))
        parts = pieces(text, 32)
        assert "".join(parts) == text
        assert all(parts) or parts == [""]
        for part in parts[1:]:
            assert part[0] == " "
        for before in parts[:-1]:
            assert before[-1].isalnum() and len(before) >= 32
    assert pieces("x" * (PIECE_CHARS + 5)) == ["x" * (PIECE_CHARS + 5)]  # no cut: one piece


def test_a_shared_prefix_keeps_its_pieces_but_the_last():
    head = " ".join(f"w{i}" for i in range(400))
    first, second = pieces(head + " alpha beta"), pieces(head + " gamma delta epsilon")
    assert first[:-2] == second[:-2] and len(first) > 5


def test_special_ids_read_from_the_template_around_the_sequence():
    template = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "</s>"}}],
        "special_tokens": {"<s>": {"ids": [1]}, "</s>": {"ids": [2]}},
    }
    assert special_ids(template) == ((1,), (2,))
    assert special_ids({"type": "Sequence", "processors": [{"type": "ByteLevel"}, template]}) == ((1,), (2,))
    assert special_ids(None) == ((), ())
    assert special_ids({"type": "BertProcessing"}) is None
    assert special_ids({**template, "single": [{"Sequence": {"id": "B"}}]}) is None


def test_an_added_token_that_strips_or_holds_a_space_takes_the_rule_away():
    config = json.loads(tokenizer_json("smollm2"))
    config["added_tokens"][0]["lstrip"] = True
    changed = json.dumps(config)
    assert split_rule(tokenizers.Tokenizer.from_str(changed)) is None
    config["added_tokens"][0]["lstrip"] = False
    config["added_tokens"][0]["content"] = "end of text"
    changed = json.dumps(config)
    assert split_rule(tokenizers.Tokenizer.from_str(changed)) is None


def test_a_text_with_more_new_chars_than_allowed_is_left_for_a_worker_thread(model_tokenizer):
    name, prompts, tokenizer = model_tokenizer
    text = " ".join(f"novel{i}" for i in range(200))  # ~1,600 chars, never encoded before
    assert prompts.encode_mostly_cached(name, text, 1_000) is None
    assert list(prompts.encode(name, text).ids) == whole(tokenizer, text)
    assert (prompts.encode_mostly_cached(name, text, 0) is None) is (name == "gemma3")
