"""The engine's tokenizer as data (ControlService.GetTokenizer), so a router hashes prompts exactly.

A gateway must not load the model's files (nor transformers) to know a prompt's token ids; it gets
the fast tokenizer's own JSON and the chat template from the engine at the handshake. The engine's
text prompts are encoded by transformers' fast tokenizer, which is this JSON run by the `tokenizers`
library with special tokens added (tests/gateway/test_prompt_hashes_e2e.py checks the equality).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from dpgate.v1 import control_pb2


def tokenizer_fingerprint(tokenizer_json: bytes, chat_template: str) -> str:
    """SHA-256 over both, each length-prefixed (u64le), so no split of one into the other collides."""
    template = chat_template.encode()
    data = struct.pack("<Q", len(tokenizer_json)) + tokenizer_json + struct.pack("<Q", len(template)) + template
    return hashlib.sha256(data).hexdigest()


def tokenizer_message(tokenizer: Any, chat_template: str | None) -> control_pb2.GetTokenizerResponse:
    """`tokenizer` is transformers' fast tokenizer; `chat_template` the template the engine renders with."""
    tokenizer_json = tokenizer.backend_tokenizer.to_str().encode()
    template = chat_template or ""
    return control_pb2.GetTokenizerResponse(
        tokenizer_json=tokenizer_json,
        chat_template=template,
        fingerprint=tokenizer_fingerprint(tokenizer_json, template),
    )
