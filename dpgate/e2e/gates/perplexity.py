"""Accuracy gate: the served model's perplexity on a bundled text, through the gateway, within
0.5% (relative) of `transformers` on the same weights and the same windows.

The text (dpgate/e2e/data/perplexity.txt, Python documentation under the PSF License v2; see
NOTICE there) is tokenized once with the served model's tokenizer and cut into non-overlapping
windows of WINDOW_TOKENS tokens (docs/accuracy.md says why). Each window is one Generate call with
prompt_logprobs through the gateway (max_tokens 1; the one generated token is not scored), spread
over the engines by the gateway's own policy; the reference scores the same token ids. The gate
passes when served / reference perplexity is within BOUND of 1; figures: both perplexities, the
ratio, the tokens scored and the seconds each side took.
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from dpgate.e2e.contracts import GateResult, Target
from dpgate.e2e.gates.perplexity_math import Comparison, Window, make_windows, perplexity
from dpgate.e2e.gates.perplexity_reference import reference_scores
from dpgate.v1 import generate_pb2, generate_pb2_grpc

NAME = "perplexity"
TEXT_PATH = Path(__file__).resolve().parents[1] / "data" / "perplexity.txt"
WINDOW_TOKENS = 1024
BOUND = 0.005


class ScoringError(RuntimeError):
    """The server's answer to a scoring call was not what was asked for (wrong tokens or count)."""


def run(
    target: Target,
    text_path: Path = TEXT_PATH,
    window_tokens: int = WINDOW_TOKENS,
    max_windows: int | None = None,
    bound: float = BOUND,
    use_cache: bool = True,
) -> GateResult:
    """Score the text on the target and on the reference and compare. Raises TimeoutError when
    target.deadline passes, grpc.RpcError when a call fails (the runner names the class)."""
    from engines.model.source import resolve_model
    from engines.model.tokenizer import load_tokenizer

    started = time.monotonic()
    source = resolve_model(target.topology.model)
    tokenizer = load_tokenizer(source)
    text = text_path.read_text(encoding="utf-8")
    token_ids = list(tokenizer.tokenizer(text, add_special_tokens=False).input_ids)
    windows = make_windows(token_ids, window_tokens, tokenizer.bos_token_id, max_windows)
    num_scored = sum(w.num_scored for w in windows)
    target.log(f"{NAME}: {len(windows)} windows of {window_tokens} tokens, {num_scored} tokens scored")

    served_started = time.monotonic()
    served_sum = score_through_gateway(target, windows)
    served_seconds = time.monotonic() - served_started
    check_deadline(target)

    reference_started = time.monotonic()
    reference = reference_scores(source, windows, use_cache=use_cache)
    reference_seconds = time.monotonic() - reference_started
    check_deadline(target)

    comparison = Comparison(perplexity(served_sum, num_scored), perplexity(reference.sum_logprob, num_scored), bound)
    figures = {
        "served_perplexity": round(comparison.served, 6),
        "reference_perplexity": round(comparison.reference, 6),
        "ratio": round(comparison.ratio, 6),
        "relative_difference": round(comparison.relative_difference, 6),
        "bound": bound,
        "tokens_scored": num_scored,
        "windows": len(windows),
        "window_tokens": window_tokens,
        "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "served_seconds": round(served_seconds, 2),
        "reference_seconds": round(reference_seconds, 2),
        "reference_cached": reference.cached,
        "seconds": round(time.monotonic() - started, 2),
    }
    detail = "" if comparison.passed else (
        f"served perplexity {comparison.served:.4f} is {comparison.relative_difference:.3%} from transformers' "
        f"{comparison.reference:.4f} on the same {num_scored} tokens; the bound is {bound:.1%}"
    )  # fmt: skip
    return GateResult(NAME, comparison.passed, figures, detail)


def score_through_gateway(target: Target, windows: list[Window]) -> float:
    """Sum of every window's prompt logprobs as the gateway returns them, windows in flight on
    two calls per engine so each engine always has the next one queued."""
    with grpc.insecure_channel(target.gateway) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        with ThreadPoolExecutor(2 * target.topology.dp) as pool:
            sums = list(pool.map(lambda window: score_window(stub, target, window), windows))
    return sum(sums)


def score_window(stub: generate_pb2_grpc.InferenceServiceStub, target: Target, window: Window) -> float:
    remaining = check_deadline(target)
    request = generate_pb2.GenerateRequest(
        token_ids=generate_pb2.TokenIds(ids=window.prompt),
        sampling=generate_pb2.SamplingParams(temperature=0.0),
        stopping=generate_pb2.StoppingCriteria(max_tokens=1, ignore_eos=True),
        prompt_logprobs=generate_pb2.PromptLogprobsOptions(top_n=0),
    )
    response = stub.Generate(request, timeout=remaining)
    scored = [t.token_id for t in response.prompt_logprobs]
    if scored != list(window.prompt[1:]):
        raise ScoringError(
            f"the server returned {len(scored)} prompt logprobs for a window of {len(window.prompt)} tokens, "
            "or for other tokens than were sent"
        )
    return sum(float(t.logprob) for t in response.prompt_logprobs)


def check_deadline(target: Target) -> float:
    """Seconds left before target.deadline; TimeoutError once it has passed."""
    remaining = target.deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError(f"the {NAME} gate ran past its deadline")
    return remaining
