"""Greedy identity: every topology's greedy outputs, through the gateway, are those of DP=1, T=1, C=1.

The reference is computed once per model for the run, by a default `dpgate engine` the gate starts
itself (reference_engine.py), one prompt at a time. The target then gets the same requests all at
once (so its batches, and its prefill chunking beside other prompts, differ from the reference's),
each unpinned and pinned to every DP rank, unary and streamed. Token ids must be identical. Where a
request asks for logprobs they must be the same float32 bits wherever C=1 (batch invariance: the
same kernels, nothing depends on the batch; and tensor parallelism splits no sum, each output of a
layer is one chain on one rank: engines/parallel/layers.py); with C > 1 attention's softmax is
combined from the DCP ranks' partial ones, so logprobs may differ by that rounding, within the
bound docs/engine.md states (1e-4).

A reference engine that cannot start raises ReferenceEngineFailed (with its last log lines): the
machine's failure, not the topology's.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import grpc

from dpgate.e2e.contracts import GateResult, Target
from dpgate.e2e.gates.calls import Output, float32_bits, generate, generate_stream, run_all
from dpgate.e2e.gates.reference_engine import reference_engine
from dpgate.v1 import generate_pb2 as pb
from dpgate.v1 import generate_pb2_grpc

NAME = "greedy-identity"
MAX_TOKENS = 24
TOP_LOGPROBS = 2
# docs/engine.md: with C > 1, "greedy tokens identical and logprobs within 1e-4".
SPLIT_SUM_LOGPROB_TOLERANCE = 1e-4
# The engine's default --max-num-batched-tokens: the long prompts are prefilled in several chunks.
DEFAULT_PREFILL_CHUNK = 512
# Figures are short: a failure's sentence is cut to this many characters in them (not in `detail`).
FIGURE_TEXT_LIMIT = 300


def _ship_log(days: int) -> str:
    """A long prompt written for this gate: a log whose lines differ in every number and word."""
    directions = ("north", "south-east", "west", "north-west", "east")
    weather = ("calm", "a light rain", "fog", "a strong gale", "clear skies")
    lines = [
        f"Day {day}: we sailed {17 + 7 * day % 41} miles {directions[day % 5]} under {weather[day * 3 % 5]}, "
        f"and the cook counted {3 + day * 11 % 29} barrels of water."
        for day in range(1, days + 1)
    ]
    return "The captain's log of the Northern Star.\n" + "\n".join(lines) + "\nDay"


@dataclass(frozen=True, slots=True)
class Prompt:
    name: str
    text: str
    logprobs: bool


PROMPTS = (
    Prompt("short-fact", "The capital of Japan is", logprobs=True),
    Prompt("code", "def fibonacci(n):\n    ", logprobs=False),
    Prompt("chat", "<|im_start|>user\nName two planets.<|im_end|>\n<|im_start|>assistant\n", logprobs=True),
    Prompt("one-word", "Once", logprobs=False),
    Prompt(
        "paragraph",
        "A lighthouse stands at the end of a long stone pier. Every evening its keeper climbs one hundred and "
        "twelve steps, trims the wick, polishes the great lens and writes the weather into a book. One winter "
        "night a small boat appeared out of the fog, and the keeper",
        logprobs=True,
    ),
    Prompt("log-25-days", _ship_log(25), logprobs=False),  # about 750 tokens: two prefill chunks
    Prompt("log-30-days", _ship_log(30), logprobs=True),  # about 900 tokens
)


def _request(prompt: Prompt) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        text=prompt.text,
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_tokens=MAX_TOKENS, ignore_eos=True),
        logprobs=pb.LogprobsOptions(top_n=TOP_LOGPROBS) if prompt.logprobs else None,
    )


_reference_lock = threading.Lock()
_reference_cache: dict[str, tuple[Output, ...]] = {}


def reference_outputs(model: str, deadline: float) -> tuple[Output, ...]:
    """The reference engine's output for each of PROMPTS, each asked alone; computed once per model
    per process (a matrix run starts one reference per model)."""
    with _reference_lock:
        if model not in _reference_cache:
            with reference_engine(model, deadline) as address, grpc.insecure_channel(address) as channel:
                stub = generate_pb2_grpc.InferenceServiceStub(channel)
                _reference_cache[model] = tuple(generate(stub, _request(p), None, deadline) for p in PROMPTS)
        return _reference_cache[model]


def difference(got: Output, want: Output, exact_logprobs: bool) -> str | None:
    """Where `got` first departs from the reference `want`, in words; None when it does not."""
    for position, (a, b) in enumerate(zip(got.token_ids, want.token_ids, strict=False)):
        if a != b:
            return f"token {position} is {a} against the reference's {b}"
    if len(got.token_ids) != len(want.token_ids):
        return f"{len(got.token_ids)} tokens against the reference's {len(want.token_ids)}"
    if got.text != want.text:
        return f"the text {got.text!r} differs from the reference's {want.text!r}"
    if len(got.logprobs) != len(want.logprobs):
        return f"{len(got.logprobs)} logprobs against the reference's {len(want.logprobs)}"
    for position, (a, b) in enumerate(zip(got.logprobs, want.logprobs, strict=True)):
        if exact_logprobs:
            same = float32_bits(a.logprob) == float32_bits(b.logprob) and [(i, float32_bits(v)) for i, v in a.top] == [
                (i, float32_bits(v)) for i, v in b.top
            ]
        else:
            same = abs(a.logprob - b.logprob) <= SPLIT_SUM_LOGPROB_TOLERANCE
        if not same:
            return (
                f"logprobs at token {position} are {a.logprob!r} {a.top} against the reference's {b.logprob!r} {b.top}"
            )
    return None


def _largest_logprob_gap(got: Output, want: Output) -> float:
    """The largest |logprob - reference| over the positions before the first differing token."""
    largest = 0.0
    for a, b in zip(got.logprobs, want.logprobs, strict=False):
        if a.token_id != b.token_id:
            break
        largest = max(largest, abs(a.logprob - b.logprob))
    return largest


def run(target: Target) -> GateResult:
    """Compare every (prompt, pin, unary/stream) call through the gateway with the reference."""
    topology = target.topology
    reference = reference_outputs(topology.model, target.deadline)
    exact_logprobs = topology.dcp == 1
    pins: list[int | None] = [None, *range(topology.dp)]
    cases = [(index, pin, mode) for index in range(len(PROMPTS)) for pin in pins for mode in ("unary", "stream")]
    with grpc.insecure_channel(target.gateway) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        calls = [
            functools.partial(
                generate if mode == "unary" else generate_stream, stub, _request(PROMPTS[i]), pin, target.deadline
            )
            for i, pin, mode in cases
        ]
        results = run_all(calls, concurrency=len(calls))
    failures = []
    logprob_gap = 0.0
    for (index, pin, mode), result in zip(cases, results, strict=True):
        if isinstance(result, grpc.RpcError):
            why = f"failed with {result.code().name}: {result.details()}"  # type: ignore[attr-defined]
        elif isinstance(result, BaseException):
            raise result
        else:
            why = difference(result, reference[index], exact_logprobs)
            logprob_gap = max(logprob_gap, _largest_logprob_gap(result, reference[index]))
        if why is not None:
            where = "unpinned" if pin is None else f"pinned to rank {pin}"
            failures.append(f"prompt {PROMPTS[index].name!r}, {mode}, {where}: {why}")
    prompt_tokens = [output.num_prompt_tokens for output in reference]
    figures = {
        "prompts": len(PROMPTS),
        "calls": len(cases),
        "mismatches": len(failures),
        "max_prompt_tokens": max(prompt_tokens),
        "prompts_over_default_prefill_chunk": sum(n > DEFAULT_PREFILL_CHUNK for n in prompt_tokens),
        "tokens_compared_per_call": MAX_TOKENS,
        "logprobs": "float32 bits" if exact_logprobs else f"within {SPLIT_SUM_LOGPROB_TOLERANCE}",
        "max_logprob_difference": logprob_gap,
    }
    if failures:
        figures["first_mismatch"] = failures[0][:FIGURE_TEXT_LIMIT]
        detail = f"{len(failures)} of {len(cases)} calls differ from DP=1/T=1/C=1; first: {failures[0]}"
        return GateResult(NAME, False, figures, detail)
    return GateResult(NAME, True, figures)
