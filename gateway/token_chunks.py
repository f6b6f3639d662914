"""Where a tokenizer's ids provably split: text cut at those places encodes piece by piece.

For a byte-level BPE tokenizer of the GPT-2 kind (no normalizer; the `ByteLevel` pre-tokenizer
with its regex; no added token with whitespace in it or that strips or matches whole words), the
ids of a text are the ids of its pieces, concatenated, when every cut lies between a letter or
digit and a following space (U+0020). Why, step by step, as `tokenizers` encodes:
  1. Added tokens are split out first (leftmost-longest over the raw text). A match across the
     cut would hold "<alnum> ", which no added token holds (checked), so the matches on each side
     are the matches of that side alone.
  2. Each remaining segment is split by the regex
         's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
     Only its first char may be an optional space; the `\\s+` alternatives hold whitespace only;
     so no match holds a non-space char followed by a space, and a match always ends at the cut.
     The regex has no look-behind or anchor and looks ahead only within whitespace runs, so the
     matches after the cut are those of the piece alone, and those before it those of the text
     up to it (which ends in a letter or digit there as in the piece).
  3. BPE runs on each pre-token alone (no dropout), and bytes map to chars one by one.
What `add_special_tokens` adds (the post-processor's template: nothing for SmolLM2, <bos> for
others) goes once around the whole: `special_ids` reads it from the JSON and `split_rule` checks
it on probe texts. Any other configuration (Gemma 3's SentencePiece-style BPE runs over whole
texts) gets no rule and is encoded whole; tests/gateway/test_token_chunks.py holds the property
on both packaged models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import tokenizers

# A piece ends at the first cut at least this many chars after it starts: about 60 tokens of
# English, so a shared prefix is reused to within one piece and a miss encodes little more.
PIECE_CHARS = 256

_BYTE_LEVEL_KEYS = {"type", "add_prefix_space", "trim_offsets", "use_regex"}
_PROBES = ("", "a", "Hello world", " leading space", "12 34\n\n<|endoftext|> x")


@dataclass(slots=True, frozen=True)
class SplitRule:
    """The tokenizer cuts at "<alnum> " boundaries; these ids wrap the whole with special tokens."""

    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]


def split_rule(tokenizer: tokenizers.Tokenizer) -> SplitRule | None:
    """The rule when this tokenizer's configuration is one the module docstring proves; else None.
    Read from the tokenizer's parts (each one's own JSON), never from the whole tokenizer JSON,
    whose vocabulary takes seconds to parse for Gemma 3."""
    config = {
        "model": {"type": type(tokenizer.model).__name__, "dropout": getattr(tokenizer.model, "dropout", None)},
        "normalizer": _state(tokenizer.normalizer),
        "pre_tokenizer": _state(tokenizer.pre_tokenizer),
        "post_processor": _state(tokenizer.post_processor),
        "truncation": tokenizer.truncation,
        "padding": tokenizer.padding,
        "added_tokens": [
            {"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip, "single_word": t.single_word}
            for t in tokenizer.get_added_tokens_decoder().values()
        ],
    }
    if not _splits_at_spaces(config):
        return None
    specials = special_ids(config["post_processor"])
    if specials is None:
        return None
    prefix, suffix = specials
    for probe in _PROBES:  # the template read from the JSON must be what encoding does
        plain = tokenizer.encode_batch_fast([probe], add_special_tokens=False)[0].ids
        if tokenizer.encode_batch_fast([probe], add_special_tokens=True)[0].ids != [*prefix, *plain, *suffix]:
            return None
    return SplitRule(prefix, suffix)


def _state(part: Any) -> dict[str, Any] | None:
    return None if part is None else json.loads(part.__getstate__())


def _splits_at_spaces(config: dict[str, Any]) -> bool:
    model, pre_tokenizer = config.get("model") or {}, config.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or model.get("dropout") is not None:
        return False
    if any(config.get(key) is not None for key in ("normalizer", "truncation", "padding")):
        return False
    if pre_tokenizer.get("type") != "ByteLevel" or set(pre_tokenizer) != _BYTE_LEVEL_KEYS:
        return False
    if pre_tokenizer["add_prefix_space"] is not False or pre_tokenizer["use_regex"] is not True:
        return False
    return all(_harmless(token) for token in config.get("added_tokens") or ())


def _harmless(token: dict[str, Any]) -> bool:
    """An added token that can never match across a cut nor reach past its own text."""
    content = token.get("content", "")
    return (
        not any(char.isspace() for char in content)
        and token.get("lstrip") is False
        and token.get("rstrip") is False
        and token.get("single_word") is False
    )


def special_ids(post_processor: dict[str, Any] | None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ids the post-processor puts before and after a single sequence, or None when unknown."""
    if post_processor is None or post_processor.get("type") == "ByteLevel":
        return (), ()
    kind = post_processor.get("type")
    if kind == "Sequence":
        prefix: tuple[int, ...] = ()
        suffix: tuple[int, ...] = ()
        for step in post_processor.get("processors", ()):
            wrapped = special_ids(step)
            if wrapped is None:
                return None
            prefix, suffix = wrapped[0] + prefix, suffix + wrapped[1]
        return prefix, suffix
    if kind != "TemplateProcessing":
        return None
    before: list[int] = []
    after: list[int] = []
    seen_sequence = False
    for item in post_processor.get("single", ()):
        if "Sequence" in item:
            if item["Sequence"].get("id") != "A" or seen_sequence:
                return None
            seen_sequence = True
        elif "SpecialToken" in item:
            special = post_processor.get("special_tokens", {}).get(item["SpecialToken"].get("id"))
            if special is None:
                return None
            (after if seen_sequence else before).extend(special["ids"])
        else:
            return None
    return (tuple(before), tuple(after)) if seen_sequence else None


def pieces(text: str, piece_chars: int = PIECE_CHARS) -> list[str]:
    """`text` cut at "<alnum> " boundaries into pieces of at least `piece_chars` chars (the last
    may be shorter). The cuts depend only on the text from the previous cut on, so two texts
    that share a prefix share its pieces, all but the last."""
    assert piece_chars >= 1  # a cut is searched for past the previous one's space
    out: list[str] = []
    start, length = 0, len(text)
    while start + piece_chars < length:
        cut = text.find(" ", start + piece_chars)
        while cut != -1 and not text[cut - 1].isalnum():
            cut = text.find(" ", cut + 1)
        if cut == -1:
            break
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return out
