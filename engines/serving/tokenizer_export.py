"""The engine's tokenizer as data (ControlService.GetTokenizer), so a router hashes prompts exactly.

A gateway must not load the model's files (nor transformers) to know a prompt's token ids; it gets
the fast tokenizer's own JSON and, for Chat, everything the engine renders a conversation with
(the template, its special-token variables and the tool/reasoning markers) at the handshake. The
engine's text prompts are encoded by transformers' fast tokenizer, which is this JSON run by the
`tokenizers` library with special tokens added; its Chat prompts are rendered by dpgate/chat/,
which the gateway runs too (tests/gateway/test_prompt_hashes_e2e.py checks both equalities).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Any

from dpgate.chat.markers import ChatMarkers
from dpgate.chat.template import ChatTemplate
from dpgate.v1 import control_pb2


def tokenizer_fingerprint(
    tokenizer_json: bytes,
    chat_template: str,
    special_tokens: Mapping[str, str] | None = None,
    markers: ChatMarkers | None = None,
) -> str:
    """SHA-256 over every input, each length-prefixed (u64le), so no split of one into the next
    collides; the special tokens sorted by name. Without a template only the first two count."""
    parts = [tokenizer_json, chat_template.encode()]
    if chat_template:
        for name, value in sorted((special_tokens or {}).items()):
            parts += [name.encode(), value.encode()]
        marks = markers or ChatMarkers()
        parts += [
            m.encode() for m in (marks.reasoning_start, marks.reasoning_end, marks.tool_call_start, marks.tool_call_end)
        ]
    data = b"".join(struct.pack("<Q", len(part)) + part for part in parts)
    return hashlib.sha256(data).hexdigest()


def tokenizer_message(tokenizer: Any, template: ChatTemplate | None) -> control_pb2.GetTokenizerResponse:
    """`tokenizer` is transformers' fast tokenizer; `template` the one the engine renders Chat with."""
    tokenizer_json = tokenizer.backend_tokenizer.to_str().encode()
    if template is None:
        return control_pb2.GetTokenizerResponse(
            tokenizer_json=tokenizer_json, fingerprint=tokenizer_fingerprint(tokenizer_json, "")
        )
    markers = template.markers
    return control_pb2.GetTokenizerResponse(
        tokenizer_json=tokenizer_json,
        chat_template=template.source,
        fingerprint=tokenizer_fingerprint(tokenizer_json, template.source, template.special_tokens, markers),
        chat_special_tokens=template.special_tokens,
        reasoning_start=markers.reasoning_start,
        reasoning_end=markers.reasoning_end,
        tool_call_start=markers.tool_call_start,
        tool_call_end=markers.tool_call_end,
    )
