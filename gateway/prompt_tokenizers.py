"""The engines' tokenizers, learned over GetTokenizer, so the gateway can hash prompts as they do.

One `tokenizers.Tokenizer` per fingerprint (engines of one model share it: the handshake refuses
one that differs). Building one from JSON and encoding text are CPU work in Rust that would stall
the event loop for milliseconds, so both run on worker threads; the gateway never loads model
files, torch or transformers.
"""

from __future__ import annotations

import asyncio
import logging

import tokenizers

from dpgate.v1 import control_pb2

logger = logging.getLogger("dpgate.gateway.prompts")


class PromptTokenizers:
    """Fingerprint -> the engine's tokenizer (and its chat template, kept for later use)."""

    __slots__ = ("_learning", "chat_templates", "tokenizers")

    def __init__(self) -> None:
        self.tokenizers: dict[str, tokenizers.Tokenizer] = {}
        self.chat_templates: dict[str, str] = {}
        self._learning: set[str] = set()

    def knows(self, fingerprint: str) -> bool:
        return fingerprint in self.tokenizers

    def is_learning(self, fingerprint: str) -> bool:
        return fingerprint in self._learning

    async def learn(self, fingerprint: str, fetch) -> bool:
        """Fetch (an async callable giving a GetTokenizerResponse) and keep it; False on a mismatch.

        The answer must carry the fingerprint the handshake saw: an engine replaced between the
        two calls is caught here rather than trusted.
        """
        if fingerprint in self.tokenizers or fingerprint in self._learning:
            return True
        self._learning.add(fingerprint)
        try:
            answer: control_pb2.GetTokenizerResponse = await fetch()
            if answer.fingerprint != fingerprint:
                logger.warning("tokenizer fingerprint changed during the handshake; will ask again")
                return False
            tokenizer = await asyncio.to_thread(tokenizers.Tokenizer.from_str, answer.tokenizer_json.decode())
            self.tokenizers[fingerprint] = tokenizer
            self.chat_templates[fingerprint] = answer.chat_template
            logger.info("learned tokenizer %s (%d tokens)", fingerprint[:16], tokenizer.get_vocab_size())
            return True
        finally:
            self._learning.discard(fingerprint)

    def encode(self, fingerprint: str, text: str) -> list[int]:
        """The engine's token ids for a text prompt (special tokens added, as the engine does).
        Blocking: call it from a worker thread."""
        return self.tokenizers[fingerprint].encode(text, add_special_tokens=True).ids
