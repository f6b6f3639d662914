"""The engine-side attacks of issue 22 (items 1-6): poison sampling parameters, a prompt of
millions of characters, a JSON schema nested deep enough to stall xgrammar, NaN in
chat_template_kwargs, 100,000 stop strings, and request ids reused right after a cancel.

Each poison must be refused with its own code and a message naming what was wrong (never
INTERNAL, which the gateway blames on the engine); a reused id must get only its own output.
tests/engines/serving/test_neighbours_e2e.py and `dpgate e2e --workload adversarial` send them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message

from dpgate.e2e.adversarial_gateway import AttackPlan, AttackResult, Scene, finish
from dpgate.e2e.neighbour import AttackWindow
from dpgate.v1 import generate_pb2 as pb
from dpgate.v1 import generate_pb2_grpc

Metadata = Sequence[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Poison:
    """One request that must be refused with `code` and a message containing `said`."""

    name: str
    rpc: str  # "Generate" or "Chat"
    request: Message
    code: grpc.StatusCode
    said: str
    timeout_s: float = 60.0


def nested_schema_text(depth: int) -> str:
    """xgrammar's conversion of this grows steeply: depth 400 took 5.7 s, 900 took 59 s."""
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return json.dumps({"type": "object", "properties": {"x": schema}})


def poisons(schema_depth: int) -> list[Poison]:
    """The poisons; `schema_depth` must make the schema's compile outlast the engine's
    --grammar-compile-timeout-s (400 for 2 s, 900 for the default 10 s)."""
    ids, depth = pb.TokenIds(ids=[1, 2, 3]), schema_depth
    kwargs_nan = pb.ChatRequest(messages=[pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="hi")])
    kwargs_nan.chat_template_kwargs.update({"x": float("nan")})
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    generate = pb.GenerateRequest
    return [
        Poison(
            "temperature 1e-40", "Generate",
            generate(token_ids=ids, sampling=pb.SamplingParams(temperature=1e-40)), invalid, "sampling.temperature",
        ),
        Poison(
            "repetition_penalty 1e-40", "Generate",
            generate(token_ids=ids, sampling=pb.SamplingParams(temperature=1.0, repetition_penalty=1e-40)),
            invalid, "sampling.repetition_penalty",
        ),
        Poison(
            "temperature inf, min_tokens 2", "Generate",
            generate(
                token_ids=ids, sampling=pb.SamplingParams(temperature=float("inf")),
                stopping=pb.StoppingCriteria(min_tokens=2, max_tokens=4),
            ),
            invalid, "sampling.temperature",
        ),
        Poison(
            "4 MB prompt", "Generate", generate(text="word " * 800_000), invalid, "prompt text has 4000000 characters"
        ),
        Poison(
            "100,000 stop strings", "Generate",
            generate(token_ids=ids, stopping=pb.StoppingCriteria(stop=[f"s{i}" for i in range(100_000)])),
            invalid, "--max-stop-strings",
        ),
        Poison("NaN in chat_template_kwargs", "Chat", kwargs_nan, invalid, "chat_template_kwargs.x"),
        Poison(
            f"json_schema nested {schema_depth} deep", "Generate",
            generate(token_ids=ids, structured_output=pb.StructuredOutput(json_schema=nested_schema_text(depth))),
            invalid, "--grammar-compile-timeout-s", timeout_s=120.0,
        ),
    ]  # fmt: skip


def send(inference: generate_pb2_grpc.InferenceServiceStub, poison: Poison, metadata: Metadata = ()) -> str | None:
    """Send `poison`; None when it was refused as it must be, else what happened instead."""
    try:
        getattr(inference, poison.rpc)(poison.request, timeout=poison.timeout_s, metadata=metadata)
    except grpc.RpcError as error:
        if error.code() == poison.code and poison.said in error.details():
            return None
        return f"{poison.name}: {error.code().name} {error.details()!r}"
    return f"{poison.name}: answered OK"


def reuse_ids_after_cancel(
    inference: generate_pb2_grpc.InferenceServiceStub, trials: int, metadata: Metadata = ()
) -> int:
    """Stream A with an id, cancel after 3 messages, at once stream B with the same id: B must end
    with its own LENGTH finish and its own token count (it got A's ABORTED output in 24 of 36).
    Returns the trials that did."""
    ok = 0
    for trial in range(trials):
        request_id = f"reuse-{os.getpid()}-{trial}-{time.monotonic_ns()}"
        a = inference.GenerateStream(
            pb.GenerateStreamRequest(
                request_id=request_id,
                token_ids=pb.TokenIds(ids=[1, 9, 9, 9]),
                stopping=pb.StoppingCriteria(max_tokens=400, ignore_eos=True),
            ),
            metadata=metadata,
        )
        for _ in range(3):
            next(a)
        a.cancel()
        b = list(
            inference.GenerateStream(
                pb.GenerateStreamRequest(
                    request_id=request_id,
                    token_ids=pb.TokenIds(ids=[1, 4, 4]),
                    stopping=pb.StoppingCriteria(max_tokens=6, ignore_eos=True),
                ),
                timeout=30,
                metadata=metadata,
            )
        )
        tokens = sum(len(m.delta.token_ids) for m in b if m.HasField("delta"))
        ok += b[-1].finish.reason == pb.FINISH_REASON_LENGTH and tokens == 6
    return ok


def engine_poisons(scene: Scene, plan: AttackPlan) -> list[AttackResult]:
    """Every poison, then the reused ids, pinned to rank 0 (whose process's RSS is measured) while
    a neighbour pinned there too works; one result each."""
    metadata = [("x-data-parallel-rank", "0")]
    if scene.api_key:
        metadata.append(("authorization", f"Bearer {scene.api_key}"))
    results = []
    with scene.neighbour(pinned_rank=0) as neighbour, grpc.insecure_channel(scene.gateway) as channel:
        inference = generate_pb2_grpc.InferenceServiceStub(channel)
        for poison in poisons(plan.schema_depth):
            with AttackWindow(poison.name, scene.engine_pids[0], neighbour) as window:
                problem = send(inference, poison, metadata)
                elapsed = time.monotonic() - window.started
            window.settle(0.3)  # the neighbour's next calls land in this attack's window
            outcome = f"refused in {elapsed * 1000:.0f} ms"
            problems = [problem] if problem else []
            bound = plan.engine_rss_bound_mb
            results.append(finish(window, plan, outcome, problems, bound, answered_ms=round(elapsed * 1000)))
        trials = plan.reused_id_trials
        name = f"request_id reused after cancel ({trials} trials)"
        with AttackWindow(name, scene.engine_pids[0], neighbour) as window:
            reused_ok = reuse_ids_after_cancel(inference, trials, metadata)
        window.settle(0.3)
        problems = [] if reused_ok == trials else [f"{trials - reused_ok} of {trials} reused ids got another's output"]
        outcome = f"{reused_ok} of {trials} got only their own output"
        results.append(finish(window, plan, outcome, problems, plan.engine_rss_bound_mb))
    return results
