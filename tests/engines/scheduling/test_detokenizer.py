"""Incremental detokenization never emits a broken character and loses nothing."""

from __future__ import annotations

from engines.scheduling.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world! The quick brown fox.",
    "雪が降っている。東京は寒いです。",
    "Emoji 🎉🚀 and accents: café, naïve, Ærøskøbing",
    "  leading spaces and\nnew lines\n\n  indented",
]


def test_deltas_concatenate_to_the_full_decode_without_replacement_chars(smollm2_tokenizer):
    for text in TEXTS:
        ids = smollm2_tokenizer(text).input_ids
        prompt = smollm2_tokenizer("Say:").input_ids
        detokenizer = IncrementalDetokenizer(smollm2_tokenizer, prompt)
        deltas = [detokenizer.add(token_id) for token_id in ids]
        deltas.append(detokenizer.flush())
        assert all("\ufffd" not in delta for delta in deltas), text
        assert "".join(deltas) == smollm2_tokenizer.decode(ids), text


def test_a_multi_byte_character_split_over_tokens_is_held_back_until_complete(smollm2_tokenizer):
    ids = smollm2_tokenizer("🎉").input_ids
    assert len(ids) > 1, "the test needs a character that spans several byte-level tokens"
    detokenizer = IncrementalDetokenizer(smollm2_tokenizer, [])
    partial = [detokenizer.add(token_id) for token_id in ids[:-1]]
    assert partial == [""] * (len(ids) - 1)
    assert detokenizer.add(ids[-1]) == "🎉"


def test_flush_returns_an_incomplete_tail_at_the_end(smollm2_tokenizer):
    ids = smollm2_tokenizer("🎉").input_ids
    detokenizer = IncrementalDetokenizer(smollm2_tokenizer, [])
    assert detokenizer.add(ids[0]) == ""
    assert detokenizer.flush() == "\ufffd"  # the request ended mid-character: say so, don't drop it
