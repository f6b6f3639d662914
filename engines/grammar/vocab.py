"""The model's vocabulary as xgrammar sees it: special tokens as empty strings.

`xgrammar.TokenizerInfo.from_huggingface` keeps a special token's text (`<|im_start|>`), so a
grammar would let it stand for those characters inside a JSON string. An empty string is how
xgrammar marks a token as special: no grammar ever allows it as text, and only the request's stop
tokens (which the matcher is built with) may be sampled, and only where the grammar can end.
Ids the model has past the tokenizer's vocabulary are empty too, so they are never allowed.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import xgrammar as xgr


def grammar_vocabulary(vocab: list[str], tokenizer: Any, eos_token_ids: frozenset[int]) -> xgr.TokenizerInfo:
    """`vocab`: `encoded_vocabulary(tokenizer, vocab_size)`, as wide as the model's lm_head (the
    mask's width). `eos_token_ids`: the model's stop set; each matcher overrides it with its
    request's own. (xgrammar is imported here: it takes about 2 s, paid by the first grammar.)"""
    import xgrammar as xgr

    vocab_size = len(vocab)
    detected = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(eos_token_ids)
    )
    return xgr.TokenizerInfo(
        vocab,
        detected.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=sorted(eos_token_ids),
        add_prefix_space=detected.add_prefix_space,
    )


def encoded_vocabulary(tokenizer: Any, vocab_size: int) -> list[str]:
    """The tokenizer's encoded token strings by id, with every special token (and every id the
    tokenizer lacks) as ""."""
    vocab = [""] * vocab_size
    for token, token_id in tokenizer.get_vocab().items():
        if token_id < vocab_size:
            vocab[token_id] = token
    for token_id in special_token_ids(tokenizer):
        if token_id < vocab_size:
            vocab[token_id] = ""
    return vocab


def special_token_ids(tokenizer: Any) -> set[int]:
    """Control tokens: the tokenizer's named special tokens and every added token marked special."""
    ids = {int(i) for i in tokenizer.all_special_ids}
    ids |= {int(i) for i, added in tokenizer.added_tokens_decoder.items() if added.special}
    return ids


def vocabulary_fingerprint(vocab: list[str], eos_token_ids: frozenset[int]) -> str:
    """Identifies a tokenizer in cache keys: the same encoded vocabulary and stop set compile the same."""
    digest = hashlib.sha256()
    digest.update(repr(sorted(eos_token_ids)).encode())
    for token in vocab:
        digest.update(token.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]
