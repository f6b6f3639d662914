"""The engine's chat template: the model's (or `--chat-template FILE`'s) text, with the
tokenizer's special tokens, as a `dpgate.chat.template.ChatTemplate`.

Rendering itself lives on the floor (dpgate/chat/) because the gateway renders the same prompt to
hash it; what stays here is reading the template and the special tokens out of transformers'
tokenizer, which only the engine loads.
"""

from __future__ import annotations

import logging
from typing import Any

from dpgate.chat.markers import ChatMarkers
from dpgate.chat.template import NO_TEMPLATE_MESSAGE, ChatTemplate, NoChatTemplateError

logger = logging.getLogger(__name__)


def template_special_tokens(tokenizer: Any) -> dict[str, str]:
    """The tokenizer's special tokens by role (`bos_token`: "<bos>", ...), as a template sees them.

    Only the single-token roles: a list-valued entry (additional special tokens) is left out, so
    the variables are plain strings that GetTokenizer can hand to a gateway unchanged.
    """
    mapping = getattr(tokenizer, "special_tokens_map", None) or {}
    return {key: value for key, value in mapping.items() if isinstance(key, str) and isinstance(value, str)}


def chat_template_for(tokenizer: Any, markers: ChatMarkers, override: str | None = None) -> ChatTemplate:
    """The template of `tokenizer` (transformers fills `chat_template` from GGUF metadata or the
    tokenizer's files), or `override` (a `--chat-template` file's text) in its place."""
    source = override if override is not None else getattr(tokenizer, "chat_template", None)
    return ChatTemplate.from_source(source, markers, template_special_tokens(tokenizer))


def load_chat_template(tokenizer: Any, markers: ChatMarkers, override: str | None) -> ChatTemplate | None:
    """The engine's template at start-up, or None (logged) when the model has none: Chat then refuses."""
    try:
        template = chat_template_for(tokenizer, markers, override)
    except NoChatTemplateError:
        logger.warning("%s; Chat and ChatStream will answer FAILED_PRECONDITION", NO_TEMPLATE_MESSAGE)
        return None
    logger.info(
        "chat template: %s (thinking %s by default, tools %s)",
        "from --chat-template" if override is not None else "the model's",
        "on" if template.thinking_default else ("off" if template.supports_thinking else "not supported"),
        "read by the template" if template.handles_tools else "shown in a Hermes system block",
    )
    return template
