"""The `smoke` workload: a few Generate and GenerateStream calls through the gateway, unpinned and
pinned to each rank. Greedy decoding with ignore_eos, so every call must produce exactly
MAX_TOKENS tokens, a stream must carry the same tokens as the unary call (prompt info first,
finish last), and every rank must answer alike (the same model on every rank)."""

from __future__ import annotations

import time

import grpc

from dpgate.e2e.contracts import GateResult, Target
from dpgate.v1 import generate_pb2, generate_pb2_grpc

RANK_KEY = "x-data-parallel-rank"
PROMPT = "The capital of France is"
MAX_TOKENS = 8
CALL_TIMEOUT_S = 60.0


def _sampling() -> generate_pb2.SamplingParams:
    return generate_pb2.SamplingParams(temperature=0.0)


def _stopping() -> generate_pb2.StoppingCriteria:
    return generate_pb2.StoppingCriteria(max_tokens=MAX_TOKENS, ignore_eos=True)


def _timeout(target: Target) -> float:
    return max(0.1, min(CALL_TIMEOUT_S, target.deadline - time.monotonic()))


def unary_tokens(stub: generate_pb2_grpc.InferenceServiceStub, metadata: list, target: Target) -> list[int]:
    request = generate_pb2.GenerateRequest(text=PROMPT, sampling=_sampling(), stopping=_stopping())
    reply = stub.Generate(request, metadata=metadata, timeout=_timeout(target))
    if reply.finish.reason != generate_pb2.FINISH_REASON_LENGTH:
        raise AssertionError(
            f"Generate finished with {generate_pb2.FinishReason.Name(reply.finish.reason)}, not LENGTH"
        )
    return list(reply.token_ids)


def stream_tokens(stub: generate_pb2_grpc.InferenceServiceStub, metadata: list, target: Target) -> list[int]:
    request = generate_pb2.GenerateStreamRequest(text=PROMPT, sampling=_sampling(), stopping=_stopping())
    events = list(stub.GenerateStream(request, metadata=metadata, timeout=_timeout(target)))
    kinds = [event.WhichOneof("event") for event in events]
    if not kinds or kinds[0] != "prompt_info" or kinds[-1] != "finish" or set(kinds[1:-1]) - {"delta"}:
        raise AssertionError(f"GenerateStream sent {kinds}: want prompt_info, deltas, finish")
    return [token for event in events[1:-1] for token in event.delta.token_ids]


def run(target: Target) -> GateResult:
    pins: list[int | None] = [None, *range(target.topology.dp)]
    problems: list[str] = []
    outputs: dict[str, list[int]] = {}
    calls = 0
    started = time.monotonic()
    with grpc.insecure_channel(target.gateway) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        for pin in pins:
            label = "unpinned" if pin is None else f"rank {pin}"
            metadata = [] if pin is None else [(RANK_KEY, str(pin))]
            try:
                unary = unary_tokens(stub, metadata, target)
                streamed = stream_tokens(stub, metadata, target)
            except (grpc.RpcError, AssertionError) as error:
                code = error.code().name if isinstance(error, grpc.RpcError) else "bad reply"
                problems.append(f"{label}: {code}: {error.details() if isinstance(error, grpc.RpcError) else error}")
                continue
            finally:
                calls += 2
            if len(unary) != MAX_TOKENS:
                problems.append(f"{label}: Generate gave {len(unary)} tokens, want {MAX_TOKENS}")
            if streamed != unary:
                problems.append(f"{label}: the stream's tokens {streamed} differ from Generate's {unary}")
            outputs[label] = unary
    if len({tuple(tokens) for tokens in outputs.values()}) > 1:
        problems.append(f"ranks answered differently: {outputs}")
    figures = {
        "calls": calls,
        "pins": len(pins),
        "max_tokens": MAX_TOKENS,
        "seconds": round(time.monotonic() - started, 3),
    }
    return GateResult("smoke", not problems, figures, "; ".join(problems))
