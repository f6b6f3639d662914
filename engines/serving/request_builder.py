"""Turns a wire request (GenerateRequest or GenerateStreamRequest, which share their fields) into
a validated `Sequence`. Every rule a client can break is checked here, where input enters."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from dpgate.chat.request import ChatLike
from dpgate.v1 import generate_pb2
from engines.grammar.spec import (
    GrammarSpec,
    choice_spec,
    ebnf_spec,
    json_object_spec,
    json_schema_spec,
    regex_spec,
)
from engines.kv.block_manager import PrefixState
from engines.kv.prefix_hash import extra_keys
from engines.sampling.params import (
    DEFAULT_MAX_STOP_STRING_BYTES,
    DEFAULT_MAX_STOP_STRINGS,
    InvalidRequestError,
    SamplingParams,
    StoppingParams,
    require,
)
from engines.scheduling.detokenizer import Decoder
from engines.scheduling.sequence import Sequence

DEFAULT_MAX_TOKENS = 16
MAX_CACHE_SALT_CHARS = 1024


class UnknownModelError(LookupError):
    """The request names a model this server does not serve (NOT_FOUND)."""


class UnsupportedFeatureError(NotImplementedError):
    """The request asks for something this engine does not implement yet (UNIMPLEMENTED)."""


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What a request is validated against."""

    served_name: str
    vocab_size: int
    max_model_len: int
    eos_token_ids: frozenset[int]
    max_stop_strings: int = DEFAULT_MAX_STOP_STRINGS  # --max-stop-strings
    max_stop_string_bytes: int = DEFAULT_MAX_STOP_STRING_BYTES  # --max-stop-string-bytes
    # Text longer than this cannot fit the context whatever it tokenizes to (`max_prompt_chars`):
    # it is refused before the tokenizer spends seconds on it. None: no such bound known.
    max_prompt_chars: int | None = None


GenerateLike = generate_pb2.GenerateRequest | generate_pb2.GenerateStreamRequest


def build_sequence(request: GenerateLike, limits: ModelLimits, tokenizer: Decoder, tenant: str = "") -> Sequence:
    """`tenant`: the gateway's x-dpgate-tenant; with the request's cache_salt, the prefix cache's extra keys."""
    check_model(request.model, limits)
    return assemble_sequence(request, _prompt_ids(request, limits, tokenizer), limits, tokenizer, tenant)


def check_model(model: str, limits: ModelLimits) -> None:
    """A request naming a model must name the one served here (an empty name means it)."""
    if model and model != limits.served_name:
        raise UnknownModelError(f"model {model!r} is not served here; this server serves {limits.served_name!r}")


def assemble_sequence(
    request: GenerateLike | ChatLike,
    prompt_ids: list[int],
    limits: ModelLimits,
    tokenizer: Decoder,
    tenant: str = "",
    default_max_tokens: int | None = DEFAULT_MAX_TOKENS,
) -> Sequence:
    """The Sequence that runs `prompt_ids` with the request's generation fields (sampling, stopping,
    structured_output, logprobs), every rule checked: Generate's path, and Chat's once it has
    rendered its prompt, so the fields mean the same on both. Without stopping.max_tokens the
    output may run to `default_max_tokens` (None: the rest of the context window)."""
    require(
        len(prompt_ids) < limits.max_model_len,
        f"prompt has {len(prompt_ids)} tokens but must be shorter than the model's context of "
        f"{limits.max_model_len} tokens",
    )
    grammar_spec = _grammar_spec(request) if request.HasField("structured_output") else None
    sampling = _sampling_params(request)
    sampling.validate(limits.vocab_size)
    stopping = _stopping_params(request, room=limits.max_model_len - len(prompt_ids), default=default_max_tokens)
    stopping.validate(
        limits.vocab_size,
        len(prompt_ids),
        limits.max_model_len,
        max_stop_strings=limits.max_stop_strings,
        max_stop_string_bytes=limits.max_stop_string_bytes,
    )
    stop_token_ids = set(stopping.stop_token_ids)
    if not stopping.ignore_eos:
        stop_token_ids |= limits.eos_token_ids
    require(
        grammar_spec is None or bool(stop_token_ids),
        "structured_output needs a token that ends the output: with stopping.ignore_eos the model's eos tokens "
        "do not, so give stopping.stop_token_ids too",
    )
    require(
        len(request.cache_salt) <= MAX_CACHE_SALT_CHARS, f"cache_salt must be at most {MAX_CACHE_SALT_CHARS} characters"
    )
    return Sequence(
        prefix=PrefixState(extra=extra_keys(tenant, request.cache_salt)),
        request_id=request.request_id or uuid.uuid4().hex,
        prompt_ids=prompt_ids,
        sampling=sampling,
        stopping=stopping,
        stop_token_ids=frozenset(stop_token_ids),
        decoder=tokenizer,
        grammar_spec=grammar_spec,
    )


def _grammar_spec(request: GenerateLike | ChatLike) -> GrammarSpec:
    wire = request.structured_output
    kind = wire.WhichOneof("kind")
    if kind == "json_schema":
        return json_schema_spec(wire.json_schema)
    if kind == "json_object":
        return json_object_spec()
    if kind == "regex":
        return regex_spec(wire.regex)
    if kind == "ebnf":
        return ebnf_spec(wire.ebnf)
    if kind == "choice":
        return choice_spec(list(wire.choice.choices))
    raise InvalidRequestError("structured_output must set one kind: json_schema, json_object, regex, ebnf or choice")


def _prompt_ids(request: GenerateLike, limits: ModelLimits, tokenizer: Decoder) -> list[int]:
    kind = request.WhichOneof("prompt")
    if kind == "text":
        require(request.text != "", "prompt text must not be empty")
        require_tokenizable(request.text, limits, "prompt text")
        ids = list(tokenizer(request.text).input_ids)
        require(bool(ids), "prompt text must encode to at least one token")
    elif kind == "token_ids":
        ids = list(request.token_ids.ids)
        require(bool(ids), "prompt token_ids must not be empty")
        for token_id in ids:
            require(
                token_id < limits.vocab_size, f"prompt token_ids {token_id} must be < vocab size {limits.vocab_size}"
            )
    else:
        raise InvalidRequestError("prompt must be set: give text or token_ids")
    return ids


def _sampling_params(request: GenerateLike | ChatLike) -> SamplingParams:
    wire = request.sampling
    top_n = request.logprobs.top_n if request.HasField("logprobs") else None
    # ChatRequest has no prompt_logprobs: a rendered conversation is not a text to score.
    prompt_top_n = None
    if "prompt_logprobs" in request.DESCRIPTOR.fields_by_name and request.HasField("prompt_logprobs"):
        prompt_top_n = request.prompt_logprobs.top_n
    return SamplingParams(
        temperature=wire.temperature if wire.HasField("temperature") else 1.0,
        top_k=wire.top_k,
        top_p=wire.top_p if wire.HasField("top_p") else 1.0,
        min_p=wire.min_p,
        seed=wire.seed if wire.HasField("seed") else None,
        repetition_penalty=wire.repetition_penalty if wire.HasField("repetition_penalty") else 1.0,
        presence_penalty=wire.presence_penalty,
        frequency_penalty=wire.frequency_penalty,
        logit_bias=dict(wire.logit_bias),
        top_logprobs=top_n,
        prompt_logprobs=prompt_top_n,
    )


def _stopping_params(request: GenerateLike | ChatLike, room: int, default: int | None) -> StoppingParams:
    """`room` is how many tokens fit after the prompt; the default max_tokens (None: all of the
    room) shrinks to it."""
    wire = request.stopping
    return StoppingParams(
        max_tokens=wire.max_tokens if wire.HasField("max_tokens") else min(default or room, room),
        min_tokens=wire.min_tokens,
        stop=tuple(wire.stop),
        stop_token_ids=frozenset(wire.stop_token_ids),
        ignore_eos=wire.ignore_eos,
    )


# A normalizer may compose a few characters into one before tokenizing (NFKC: "e" + U+0301 -> "é");
# the bound allows for four, far more than any composition merges.
_NORMALIZER_SLACK = 4


def max_prompt_chars(tokenizer: Any, max_model_len: int) -> int:
    """The most characters a text can have and still encode to fewer than `max_model_len` tokens.
    No token stands for more characters than its longest vocabulary string has (byte-level BPE
    writes a byte per character, SentencePiece a character per character, byte fallbacks more),
    so a text with more than (max_model_len - 1) x that x the slack cannot fit."""
    longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
    return (max_model_len - 1) * max(1, longest) * _NORMALIZER_SLACK


def require_tokenizable(text: str, limits: ModelLimits, field: str) -> None:
    """Refuse, without tokenizing, text too long to fit the model's context: a 4 MB prompt took
    6.4 s to tokenize before it could be refused (issue 22)."""
    if limits.max_prompt_chars is not None:
        require(
            len(text) <= limits.max_prompt_chars,
            f"{field} has {len(text)} characters, more than any prompt that fits the model's context of "
            f"{limits.max_model_len} tokens can have ({limits.max_prompt_chars})",
        )
