"""Stop strings are bounded and cost O(new text) per step (issue 22, item 6): 100,000 stop strings
(~1 MB) were accepted and 64 tokens took 9.5 s instead of 0.08 s, slowing every neighbour. The
limits are engine flags (--max-stop-strings, --max-stop-string-bytes); the scan keeps one automaton
state per request, so the stop text's size no longer multiplies each step's cost."""

from __future__ import annotations

import random
import time

import pytest

from dpgate.v1 import generate_pb2 as pb
from engines.sampling.params import InvalidRequestError, SamplingParams, StoppingParams
from engines.sampling.sampler import SampledToken
from engines.scheduling.sequence import FinishReason, Sequence
from engines.serving.request_builder import ModelLimits, build_sequence

ALPHABET = "ab\nc"


class CharDecoder:
    """Token i is the character ALPHABET[i % 4]: every step adds exactly one known character."""

    def decode(self, token_ids, skip_special_tokens=True):
        return "".join(ALPHABET[t % len(ALPHABET)] for t in token_ids)


def char_sequence(stop: tuple[str, ...], min_tokens: int = 0, max_tokens: int = 10_000) -> Sequence:
    return Sequence(
        request_id="r",
        prompt_ids=[0],
        sampling=SamplingParams(temperature=0.0),
        stopping=StoppingParams(max_tokens=max_tokens, min_tokens=min_tokens, stop=stop),
        stop_token_ids=frozenset({999}),
        decoder=CharDecoder(),
    )


def expected(text: str, stops: tuple[str, ...], min_tokens: int) -> tuple[str, str | None]:
    """The spec, one character a step: the first step past min_tokens at which a stop string ends
    the text stops it there, cut at the earliest such start; the stop text is never streamed."""
    for end in range(min_tokens + 1, len(text) + 1):
        ending = [stop for stop in stops if text[:end].endswith(stop)]
        if ending:
            stop = max(ending, key=len)  # the longest ending here starts earliest
            return text[: end - len(stop)], stop
    return text, None


def held_back(text: str, stops: tuple[str, ...]) -> int:
    return max((k for stop in stops for k in range(len(stop)) if k and text.endswith(stop[:k])), default=0)


@pytest.mark.parametrize("seed", range(40))
def test_stream_and_stop_match_the_spec_on_random_text_and_stops(seed):
    rng = random.Random(seed)
    stops = tuple({"".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 6))})
    text = "".join(rng.choice(ALPHABET) for _ in range(60))
    min_tokens = rng.choice([0, 0, 3, 10])
    seq = char_sequence(stops, min_tokens=min_tokens, max_tokens=len(text))
    streamed = ""
    for step, char in enumerate(text, start=1):
        output = seq.append(SampledToken(ALPHABET.index(char)))
        streamed += output.text
        if seq.is_finished:
            break
        assert streamed == text[:step][: step - held_back(text[:step], stops)], (stops, text[:step])
    want_text, want_stop = expected(text, stops, min_tokens)
    if want_stop is None:
        assert seq.finish_reason is FinishReason.LENGTH and streamed == text
    else:
        assert seq.finish_reason is FinishReason.STOP and seq.stop_string == want_stop
        assert streamed == want_text and seq.output_text == want_text


def limits(**bounds) -> ModelLimits:
    return ModelLimits("m", 49152, 4096, frozenset({2}), **bounds)


def stop_request(stop: list[str]) -> pb.GenerateRequest:
    return pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 2]), stopping=pb.StoppingCriteria(max_tokens=4, stop=stop))


def test_more_stop_strings_than_the_flag_allows_are_refused_naming_the_flag():
    with pytest.raises(InvalidRequestError) as refused:
        build_sequence(stop_request(["x"] * 5), limits(max_stop_strings=4), CharDecoder())
    assert str(refused.value) == "stopping.stop holds 5 strings; at most 4 are allowed (--max-stop-strings)"


def test_stop_strings_over_the_byte_budget_are_refused_naming_the_flag():
    with pytest.raises(InvalidRequestError) as refused:
        build_sequence(stop_request(["é" * 40, "x" * 30]), limits(max_stop_string_bytes=100), CharDecoder())
    assert str(refused.value) == (
        "stopping.stop strings hold 110 bytes together; at most 100 are allowed (--max-stop-string-bytes)"
    )


def test_the_issues_100000_stop_strings_are_refused_by_the_defaults():
    with pytest.raises(InvalidRequestError, match="--max-stop-strings"):
        build_sequence(stop_request([f"s{i:08d}" for i in range(100_000)]), limits(), CharDecoder())


def seconds_per_step(stops: tuple[str, ...], num_steps: int = 300) -> float:
    """The stop handling of `num_steps` steps of text that keeps almost matching every stop string."""
    seq = char_sequence(stops)
    tokens = [ALPHABET.index(c) for c in ("a" * 200 + "b") * 4][:num_steps]
    best = float("inf")
    for _ in range(3):
        seq = char_sequence(stops)
        started = time.perf_counter()
        for token in tokens:
            seq.append(SampledToken(token))
        best = min(best, (time.perf_counter() - started) / len(tokens))
    return best


def test_a_step_costs_about_the_same_with_the_most_stop_text_the_defaults_allow():
    defaults = ModelLimits("m", 1, 2, frozenset())
    size = defaults.max_stop_string_bytes // defaults.max_stop_strings
    # Each stop is many "a"s then a distinct tail: every run of "a"s is a prefix of all of them, the
    # worst case for scanning each stop string against the text's tail (31x before the automaton).
    most = tuple("a" * (size - 2) + f"{i:02d}" for i in range(defaults.max_stop_strings))
    one = ("zz",)
    ratio = seconds_per_step(most) / seconds_per_step(one)
    assert ratio < 4, f"a step with {len(most)} stop strings of {size} chars costs {ratio:.1f}x one with a single one"
