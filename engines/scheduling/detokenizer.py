"""Incremental detokenization that never splits a character.

Decoding each new token alone breaks byte-level BPE characters that span tokens and loses
spaces that depend on the previous token. Instead the detokenizer decodes a short window of
recent tokens twice (with and without the new ones) and emits the difference, holding text back
while it ends in U+FFFD, the mark of an incomplete UTF-8 sequence.
"""

from __future__ import annotations

from typing import Protocol

# How many prompt tokens seed the window, so the first output token decodes in context.
PROMPT_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas. `token_ids` holds the prompt's last few
    ids followed by every output id; `prefix_offset:read_offset` is the already-emitted window."""

    def __init__(self, decoder: Decoder, prompt_ids: list[int]):
        self.decoder = decoder
        self.token_ids = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)

    def add(self, token_id: int) -> str:
        """Append one id; return the newly complete text (possibly empty)."""
        self.token_ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return any held-back text, complete or not (the request ended)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        window = self.token_ids[self.prefix_offset :]
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(window)
        if len(full_text) <= len(prefix_text) or (full_text.endswith(REPLACEMENT_CHAR) and not final):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        return full_text[len(prefix_text) :]

    def _decode(self, token_ids: list[int]) -> str:
        return self.decoder.decode(token_ids, skip_special_tokens=True)
