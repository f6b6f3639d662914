"""Each token's own bytes and text, for logprobs.

OpenAI's logprobs name every token by its text and its bytes; decoding a single id with the
tokenizer's `decode` is lossy (a token holding half of a multi-byte character comes back as
U+FFFD, and SentencePiece decoders drop a leading space). The bytes are read from the token's
stored string instead, by the rule its decoder applies:

- byte-level BPE (GPT-2, SmolLM2): every byte is stored as one printable character; the table
  that maps them back is rebuilt here from that scheme (printable Latin-1 bytes stand for
  themselves, the other 68 are shifted past U+0100 in byte order);
- SentencePiece with byte fallback (Gemma, Llama 2): `<0xNN>` is the byte NN, `▁` a space;
- anything else: the tokenizer's own `decode` of the id alone.

Added tokens (`<|im_end|>`) are stored as their text under every scheme. Results are kept per
id, since logprobs ask for the same few thousand tokens again and again.
"""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any

_SENTENCEPIECE_SPACE = "\u2581"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class DecoderKind(Enum):
    BYTE_LEVEL = "byte_level"
    BYTE_FALLBACK = "byte_fallback"
    OTHER = "other"


def byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's character for each byte, inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {chr(byte): byte for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            alphabet[chr(256 + shifted)] = byte
            shifted += 1
    return alphabet


def decoder_kind(decoder: dict[str, Any] | None) -> DecoderKind:
    """Which rule stores the tokens of a `tokenizers` decoder spec (tokenizer.json's "decoder")."""
    if not decoder:
        return DecoderKind.OTHER
    steps = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    types = {step.get("type") for step in steps}
    if "ByteLevel" in types:
        return DecoderKind.BYTE_LEVEL
    if "ByteFallback" in types:
        return DecoderKind.BYTE_FALLBACK
    return DecoderKind.OTHER


class TokenTexts:
    """Bytes and text of single tokens of one tokenizer (a transformers fast tokenizer)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        spec = json.loads(tokenizer.backend_tokenizer.to_str())
        self.kind = decoder_kind(spec.get("decoder"))
        self._added = {int(token.get("id")) for token in spec.get("added_tokens", [])}
        self._alphabet = byte_level_alphabet() if self.kind is DecoderKind.BYTE_LEVEL else {}
        self._bytes: dict[int, bytes] = {}

    def token_bytes(self, token_id: int) -> bytes:
        cached = self._bytes.get(token_id)
        if cached is None:
            cached = self._bytes[token_id] = self._read(token_id)
        return cached

    def text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def _read(self, token_id: int) -> bytes:
        stored = self._tokenizer.convert_ids_to_tokens(token_id)
        if stored is None:  # an id past the tokenizer's vocabulary (the model's rows may be wider)
            return b""
        if token_id in self._added:
            return stored.encode()
        if self.kind is DecoderKind.BYTE_LEVEL:
            return _byte_level(stored, self._alphabet)
        if self.kind is DecoderKind.BYTE_FALLBACK:
            byte = _BYTE_TOKEN.fullmatch(stored)
            return bytes([int(byte.group(1), 16)]) if byte else stored.replace(_SENTENCEPIECE_SPACE, " ").encode()
        return self._tokenizer.decode([token_id]).encode()


def _byte_level(stored: str, alphabet: dict[str, int]) -> bytes:
    out = bytearray()
    for char in stored:
        byte = alphabet.get(char)
        if byte is None:  # not from the byte alphabet: a character kept as itself
            out += char.encode()
        else:
            out.append(byte)
    return bytes(out)
