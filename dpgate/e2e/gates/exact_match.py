"""Exact match: a bundled question set (data/exact_match.json) asked greedily through the gateway,
each answer normalised and compared with the one expected answer.

Each model's threshold lives beside the questions, measured at DP=1/T=1/C=1 with the prompt style
that scored best for it (docs/accuracy.md: the baselines, the date, how they were measured and the
margin kept). A model with no baseline fails the gate: there is nothing to judge it against.

`python -m dpgate.e2e.gates.exact_match --gateway HOST:PORT --model NAME` measures both prompt
styles and prints their scores, which is how the baselines were taken.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from dataclasses import dataclass
from importlib import resources
from typing import Any

import grpc

from dpgate.e2e.contracts import GateResult, Target
from dpgate.e2e.gates.calls import remaining, run_all
from dpgate.v1 import generate_pb2 as pb
from dpgate.v1 import generate_pb2_grpc

NAME = "exact-match"
MAX_TOKENS = 12
STYLES = ("completion", "chat")
INSTRUCTION = "Answer each question with a single word, name or number."
# Worked examples shown before every question (in both styles); none of them is in the set.
EXAMPLES = (
    ("What is the capital of Portugal?", "Lisbon"),
    ("What is 1 + 1?", "2"),
    ("What color is a ripe banana?", "yellow"),
)
_TRAILING_PUNCTUATION = ".,;:!?"
FIGURE_TEXT_LIMIT = 300  # the first miss in the figures is cut to this many characters


@dataclass(frozen=True, slots=True)
class Question:
    question: str
    answer: str


def load_data() -> dict[str, Any]:
    """The bundled question set and the per-model baselines (package data of dpgate.e2e)."""
    return json.loads(resources.files("dpgate.e2e").joinpath("data", "exact_match.json").read_text())


def questions(data: dict[str, Any]) -> tuple[Question, ...]:
    return tuple(Question(item["question"], item["answer"]) for item in data["questions"])


def normalise(text: str) -> str:
    """Strip, collapse whitespace, casefold, drop trailing punctuation: what "exact" means here."""
    text = re.sub(r"\s+", " ", text.strip()).casefold()
    return text.rstrip(_TRAILING_PUNCTUATION).strip()


def completion_prompt(question: str) -> str:
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in EXAMPLES)
    return f"{INSTRUCTION}\n\n{shots}Question: {question}\nAnswer:"


def chat_messages(question: str) -> list[pb.ChatMessage]:
    messages = [pb.ChatMessage(role=pb.CHAT_ROLE_SYSTEM, content=INSTRUCTION)]
    for q, a in EXAMPLES:
        messages += [
            pb.ChatMessage(role=pb.CHAT_ROLE_USER, content=q),
            pb.ChatMessage(role=pb.CHAT_ROLE_ASSISTANT, content=a),
        ]
    return [*messages, pb.ChatMessage(role=pb.CHAT_ROLE_USER, content=question)]


_GREEDY = pb.SamplingParams(temperature=0.0)
_STOPPING = pb.StoppingCriteria(max_tokens=MAX_TOKENS, stop=["\n"])


def ask(stub: generate_pb2_grpc.InferenceServiceStub, style: str, question: str, deadline: float) -> str:
    """The model's answer text to one question, greedy, in prompt style `style`."""
    if style == "chat":
        chat = pb.ChatRequest(messages=chat_messages(question), sampling=_GREEDY, stopping=_STOPPING)
        return stub.Chat(chat, timeout=remaining(deadline)).content
    request = pb.GenerateRequest(text=completion_prompt(question), sampling=_GREEDY, stopping=_STOPPING)
    return stub.Generate(request, timeout=remaining(deadline)).text


def score(gateway: str, style: str, deadline: float) -> tuple[int, list[str]]:
    """How many questions the model behind `gateway` answers exactly, and the misses in words; all
    are in flight at once (the score does not depend on the batching, the run time does).
    A failed call raises grpc.RpcError: a gate that cannot ask cannot score."""
    data = questions(load_data())
    with grpc.insecure_channel(gateway) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        answers = run_all(
            [functools.partial(ask, stub, style, q.question, deadline) for q in data], concurrency=len(data)
        )
    misses = []
    for item, answer in zip(data, answers, strict=True):
        if isinstance(answer, BaseException):
            raise answer
        if normalise(answer) != normalise(item.answer):
            misses.append(f"{item.question!r}: {answer!r} (expected {item.answer!r})")
    return len(data) - len(misses), misses


def run(target: Target) -> GateResult:
    """Score the target's model with its recorded prompt style against its recorded threshold."""
    model = target.topology.model
    baseline = load_data()["baselines"].get(model)
    if baseline is None:
        return GateResult(NAME, False, {"model": model}, f"no exact-match baseline is recorded for model {model!r}")
    try:
        correct, misses = score(target.gateway, baseline["style"], target.deadline)
    except grpc.RpcError as error:
        why = f"a question failed with {error.code().name}: {error.details()}"  # type: ignore[attr-defined]
        return GateResult(NAME, False, {"model": model}, why)
    figures = {
        "model": model,
        "style": baseline["style"],
        "questions": correct + len(misses),
        "correct": correct,
        "threshold": baseline["threshold"],
        "baseline": baseline["correct"],
    }
    if misses:
        figures["first_miss"] = misses[0][:FIGURE_TEXT_LIMIT]
    if correct < baseline["threshold"]:
        detail = f"{correct} of {correct + len(misses)} exact matches, below the threshold {baseline['threshold']}"
        return GateResult(NAME, False, figures, detail)
    return GateResult(NAME, True, figures)


def main(argv: list[str] | None = None) -> int:
    """Measure both prompt styles against a running gateway (or engine) and print the scores."""
    import time

    parser = argparse.ArgumentParser(prog="python -m dpgate.e2e.gates.exact_match", description=main.__doc__)
    parser.add_argument("--gateway", required=True, help="HOST:PORT of a gateway or engine")
    parser.add_argument("--model", required=True, help="the served model's name (printed with the scores)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for each style (default: 900)")
    args = parser.parse_args(argv)
    for style in STYLES:
        try:
            correct, misses = score(args.gateway, style, time.monotonic() + args.timeout)
        except grpc.RpcError as error:
            print(json.dumps({"model": args.model, "style": style, "error": error.details()}))  # type: ignore[attr-defined]
            continue
        total = correct + len(misses)
        print(
            json.dumps({"model": args.model, "style": style, "correct": correct, "questions": total, "misses": misses})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
