"""A request's state inside the engine: tokens so far, text so far, and when it is done.

The sequence owns stop handling because stopping must happen where tokens are produced: a stop
token or string ends generation at once, and text that might be the start of a stop string is
held back from the stream until it is known not to be one.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any, Protocol

from engines.grammar.spec import GrammarSpec
from engines.kv.block_manager import PrefixState
from engines.sampling.params import InvalidRequestError, SamplingParams, StoppingParams
from engines.sampling.tokens import SampledToken
from engines.scheduling.detokenizer import Decoder, IncrementalDetokenizer
from engines.scheduling.stop_strings import StopScanner


class GrammarState(Protocol):
    """What a sequence tells its grammar and asks of it (engines/grammar/matcher.py's
    `RequestGrammar` is one): a protocol, so scheduling imports neither xgrammar nor torch."""

    def accept(self, token_id: int) -> None: ...

    @property
    def is_terminated(self) -> bool: ...


# Handles are unique in the process for its lifetime: two live requests never share one, and a
# handle is never reused, so a late output of an ended request cannot reach a newer one.
_next_handle = itertools.count(1).__next__


class FinishReason(enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    ABORTED = "aborted"


@dataclass(slots=True)
class StepOutput:
    """What one step produced for one sequence, ready for the client. `handle` says which request
    it belongs to; `request_id` is only the client's label."""

    handle: int
    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[SampledToken]
    finish_reason: FinishReason | None = None
    # On the output that carries the first generated token, when prompt logprobs were asked for:
    # one per prompt token after the first.
    prompt_logprobs: list[SampledToken] = field(default_factory=list)
    stop_token_id: int | None = None
    stop_string: str | None = None
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache at admission
    error: InvalidRequestError | None = None  # the request ended because its own rules conflict


@dataclass(slots=True)
class Sequence:
    """`request_id` is the client's label and need not be unique; `handle` is the engine's own
    identity for this request, and everything inside the engine (abort, output routing) uses it."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    stopping: StoppingParams
    stop_token_ids: frozenset[int]  # eos (unless ignore_eos) plus the request's stop_token_ids
    decoder: Decoder
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    num_emitted_chars: int = 0
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None
    stop_string: str | None = None
    # The sampler's random state for this request (a torch.Generator), made by the engine on the
    # request's first sampled step (engines.sampling.sampler.request_generator); opaque here.
    generator: Any = None
    block_table: list[int] = field(default_factory=list)  # KV-cache blocks, owned via the BlockManager
    num_computed_tokens: int = 0  # tokens whose keys and values are in the cache
    # Its place in the prefix cache (extra keys: tenant and cache_salt), and the prompt tokens the
    # cache gave it at its first admission (None until admitted).
    prefix: PrefixState = field(default_factory=PrefixState)
    num_cached_tokens: int | None = None
    grammar_spec: GrammarSpec | None = None  # what structured_output asks for
    grammar: GrammarState | None = None  # its matcher, attached once the grammar has compiled
    error: InvalidRequestError | None = None
    # Scored prompt tokens so far: entry i is prompt token i + 1 given tokens 0..i. Kept across a
    # preemption, so recomputing the prompt never scores a position twice.
    prompt_logprobs: list[SampledToken] = field(default_factory=list)
    detokenizer: IncrementalDetokenizer = field(init=False)
    stop_scanner: StopScanner | None = field(init=False, default=None)  # None: no stop strings
    handle: int = field(init=False, default_factory=_next_handle)

    def __post_init__(self) -> None:
        self.detokenizer = IncrementalDetokenizer(self.decoder, self.prompt_ids)
        if self.stopping.stop:
            self.stop_scanner = StopScanner(self.stopping.stop)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def token_ids(self) -> list[int]:
        """Prompt then output: what the model has seen or will see, in order."""
        return self.prompt_ids + self.output_ids

    def prompt_scoring(self, start: int, num_tokens: int) -> tuple[int, list[int]]:
        """For a chunk of positions [start, start + num_tokens): the first position to score and the
        prompt tokens those positions predict (empty when prompt logprobs are off or all known)."""
        if self.sampling.prompt_logprobs is None:
            return 0, []
        first = max(start, len(self.prompt_logprobs))
        end = min(start + num_tokens, len(self.prompt_ids) - 1)
        return first, self.prompt_ids[first + 1 : end + 1] if end > first else []

    @property
    def blocked_token_ids(self) -> list[int]:
        """Stop tokens may not be sampled before min_tokens outputs exist."""
        return sorted(self.stop_token_ids) if len(self.output_ids) < self.stopping.min_tokens else []

    def append(self, sampled: SampledToken) -> StepOutput:
        """Record one sampled token, apply the stop rules and return what the client may see now."""
        token_id = sampled.token_id
        self.output_ids.append(token_id)
        if self.grammar is not None:
            self.grammar.accept(token_id)
        if token_id in self.stop_token_ids:
            self._finish(FinishReason.STOP)
            self.stop_token_id = token_id
        else:
            new_text = self.detokenizer.add(token_id)
            self.output_text += new_text
            self._check_stop_strings(new_text)
        if self.grammar is not None and self.grammar.is_terminated:
            self._finish(FinishReason.STOP)
        if not self.is_finished and len(self.output_ids) >= self.stopping.max_tokens:
            self._finish(FinishReason.LENGTH)
        if self.is_finished and self.stop_string is None and self.stop_token_id is None:
            self.output_text += self.detokenizer.flush()
        output = self._emit([token_id], [sampled] if sampled.logprob is not None else [])
        if len(self.output_ids) == 1:
            output.prompt_logprobs = list(self.prompt_logprobs)
        return output

    def abort(self) -> StepOutput:
        self._finish(FinishReason.ABORTED)
        return self._emit([], [])

    def fail(self, error: InvalidRequestError) -> StepOutput:
        """End the request with an error of its own making (its grammar and stop rules conflict);
        the client gets the error after the tokens already sent."""
        self.error = error
        return self.abort()

    def _finish(self, reason: FinishReason) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def _check_stop_strings(self, new_text: str) -> None:
        """Feed this step's text to the stop automaton (O(new text)); a stop string that ends in it,
        once min_tokens outputs exist, cuts the text where it starts and ends the request."""
        if self.stop_scanner is None:
            return
        offset = len(self.output_text) - len(new_text)
        match = self.stop_scanner.feed(new_text, offset, report=len(self.output_ids) > self.stopping.min_tokens)
        if match is not None:
            start, index = match
            self.output_text = self.output_text[:start]
            self.stop_string = self.stopping.stop[index]
            self._finish(FinishReason.STOP)

    def _held_back_chars(self) -> int:
        """Length of the longest text suffix that could still grow into a stop string."""
        if self.is_finished or self.stop_scanner is None:
            return 0
        return self.stop_scanner.held

    def _emit(self, token_ids: list[int], logprobs: list[SampledToken]) -> StepOutput:
        visible = len(self.output_text) - self._held_back_chars()
        text = self.output_text[self.num_emitted_chars : visible] if visible > self.num_emitted_chars else ""
        self.num_emitted_chars = max(self.num_emitted_chars, visible)
        return StepOutput(
            handle=self.handle,
            request_id=self.request_id,
            text=text,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=self.finish_reason,
            stop_token_id=self.stop_token_id,
            stop_string=self.stop_string,
            num_prompt_tokens=len(self.prompt_ids),
            num_generated_tokens=len(self.output_ids),
            num_cached_tokens=self.num_cached_tokens or 0,
            error=self.error,
        )
