"""Each token's bytes and text for logprobs: laid end to end they are exactly the text the
tokenizer encoded, under byte-level BPE (SmolLM2) and SentencePiece byte fallback (Gemma 3)."""

from __future__ import annotations

import pytest

from engines.model.token_texts import DecoderKind, TokenTexts, byte_level_alphabet, decoder_kind

TEXT = "Paris Zürich naïve café 東京 データ 🙂 def  return {}\n\t x  <b> 0x41"


def test_the_byte_level_alphabet_gives_every_byte_one_character():
    alphabet = byte_level_alphabet()
    assert sorted(alphabet.values()) == list(range(256))
    assert alphabet["A"] == ord("A") and alphabet["Ġ"] == ord(" ") and alphabet["Ċ"] == ord("\n")


@pytest.mark.parametrize(
    ("decoder", "kind"),
    [
        ({"type": "ByteLevel"}, DecoderKind.BYTE_LEVEL),
        ({"type": "Sequence", "decoders": [{"type": "Replace"}, {"type": "ByteFallback"}]}, DecoderKind.BYTE_FALLBACK),
        ({"type": "WordPiece"}, DecoderKind.OTHER),
        (None, DecoderKind.OTHER),
    ],
)
def test_the_decoder_spec_names_the_rule(decoder, kind):
    assert decoder_kind(decoder) is kind


def assert_tokens_rebuild_the_text(tokenizer) -> TokenTexts:
    texts = TokenTexts(tokenizer)
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    assert b"".join(texts.token_bytes(i) for i in ids) == TEXT.encode()
    return texts


def test_smollm2_tokens_rebuild_the_text_byte_for_byte(smollm2_tokenizer):
    texts = assert_tokens_rebuild_the_text(smollm2_tokenizer)
    assert texts.kind is DecoderKind.BYTE_LEVEL
    (space_paris,) = smollm2_tokenizer(" Paris", add_special_tokens=False).input_ids
    assert texts.text(space_paris) == " Paris"
    end = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert texts.token_bytes(end) == b"<|im_end|>"
    # 東 is three UTF-8 bytes spread over byte tokens: each alone is bytes, not a character
    partial = [i for i in smollm2_tokenizer("東", add_special_tokens=False).input_ids if len(texts.token_bytes(i)) < 3]
    assert partial and all("\ufffd" in texts.text(i) for i in partial)
    assert texts.token_bytes(10**6) == b""  # past the vocabulary (the model's rows may be wider)


@pytest.mark.e2e
def test_gemma3_tokens_rebuild_the_text_byte_for_byte():
    from engines.model.source import resolve_model
    from engines.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model("gemma3-270m")).tokenizer
    texts = assert_tokens_rebuild_the_text(tokenizer)
    assert texts.kind is DecoderKind.BYTE_FALLBACK
    (byte,) = tokenizer.convert_tokens_to_ids(["<0xE2>"])
    assert texts.token_bytes(byte) == b"\xe2" and texts.text(byte) == "\ufffd"
