"""Per-request generation parameters, validated where they enter from the wire.

`SamplingParams` and `StoppingParams` are plain data the sampler and the sequence read;
`InvalidRequestError` names the field and the rule, and the server turns it into INVALID_ARGUMENT.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dpgate.invalid_request import InvalidRequestError, require

MAX_TOP_LOGPROBS = 20
# What the sampler can compute with in float32. Logits are divided by the temperature and by the
# repetition penalty: below these floors a finite logit becomes inf and softmax gives NaN (1e-40
# did, issue 22); above the ceilings, or at inf, -inf / inf is NaN. Within them the largest
# quotient (|logit| + bias 100, / 0.01, / 0.001) stays far below float32's 3.4e38.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 100.0
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 100.0
# Stop strings: OpenAI's API takes 4, chat clients a handful; the stop automaton is built per
# request from all of them (engines/scheduling/stop_strings.py), so its size is bounded here.
DEFAULT_MAX_STOP_STRINGS = 32
DEFAULT_MAX_STOP_STRING_BYTES = 4096


class UnsampleableRowError(InvalidRequestError):
    """A request's parameters left its logits row without a probability distribution (NaN or no
    mass). Validation should make it impossible; if it still happens it ends only that request,
    as the client's error, never the step."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token. temperature == 0 means greedy."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    top_logprobs: int | None = None  # None: no logprobs; n >= 0: sampled token plus n alternatives
    prompt_logprobs: int | None = None  # None: none; n >= 0: each prompt token's logprob plus n alternatives

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: int) -> None:
        require(
            self.temperature == 0.0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE,
            f"sampling.temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]",
        )
        require(self.top_k >= 0, "sampling.top_k must be >= 0 (0 disables it)")
        require(0.0 < self.top_p <= 1.0, "sampling.top_p must be in (0, 1]")
        require(0.0 <= self.min_p <= 1.0, "sampling.min_p must be in [0, 1]")
        require(
            MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY,
            f"sampling.repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}]",
        )
        require(-2.0 <= self.presence_penalty <= 2.0, "sampling.presence_penalty must be in [-2, 2]")
        require(-2.0 <= self.frequency_penalty <= 2.0, "sampling.frequency_penalty must be in [-2, 2]")
        for token_id, bias in self.logit_bias.items():
            require(token_id < vocab_size, f"sampling.logit_bias token id {token_id} must be < vocab size {vocab_size}")
            require(-100.0 <= bias <= 100.0, f"sampling.logit_bias value for token {token_id} must be in [-100, 100]")
        if self.top_logprobs is not None:
            require(0 <= self.top_logprobs <= MAX_TOP_LOGPROBS, f"logprobs.top_n must be in [0, {MAX_TOP_LOGPROBS}]")
        if self.prompt_logprobs is not None:
            require(
                0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS,
                f"prompt_logprobs.top_n must be in [0, {MAX_TOP_LOGPROBS}]",
            )


@dataclass(frozen=True, slots=True)
class StoppingParams:
    """When a request ends: max_tokens, stop strings and stop tokens (beside the model's eos)."""

    max_tokens: int = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False

    def validate(
        self,
        vocab_size: int,
        num_prompt_tokens: int,
        max_model_len: int,
        *,
        max_stop_strings: int = DEFAULT_MAX_STOP_STRINGS,
        max_stop_string_bytes: int = DEFAULT_MAX_STOP_STRING_BYTES,
    ) -> None:
        require(self.max_tokens >= 1, "stopping.max_tokens must be >= 1")
        room = max_model_len - num_prompt_tokens
        require(
            self.max_tokens <= room,
            f"stopping.max_tokens ({self.max_tokens}) must be <= {room}: the prompt has {num_prompt_tokens} "
            f"tokens and the model's context is {max_model_len}",
        )
        require(self.min_tokens >= 0, "stopping.min_tokens must be >= 0")
        require(self.min_tokens <= self.max_tokens, "stopping.min_tokens must be <= stopping.max_tokens")
        require(
            len(self.stop) <= max_stop_strings,
            f"stopping.stop holds {len(self.stop)} strings; at most {max_stop_strings} are allowed "
            "(--max-stop-strings)",
        )
        num_bytes = sum(len(stop.encode()) for stop in self.stop)
        require(
            num_bytes <= max_stop_string_bytes,
            f"stopping.stop strings hold {num_bytes} bytes together; at most {max_stop_string_bytes} are allowed "
            "(--max-stop-string-bytes)",
        )
        require(all(self.stop), "stopping.stop strings must not be empty")
        for token_id in self.stop_token_ids:
            require(token_id < vocab_size, f"stopping.stop_token_ids {token_id} must be < vocab size {vocab_size}")


