"""Sampling as a pure function: logits, a request's parameters and its token history in; a token out.

Logit processors run in a fixed order (grammar mask, bias, penalties, eos masking, temperature,
top-k, top-p, min-p) on one float32 row; the grammar's bitmask is applied to a step's constrained
rows at once (engines/grammar/bitmask.py) and those rows arrive here already masked. Randomness
comes only from the request's own `torch.Generator`, so a seeded request gives the same tokens
whatever else the engine is doing.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from engines.sampling.params import SamplingParams, UnsampleableRowError
from engines.sampling.tokens import SampledToken


def apply_penalties(
    logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]
) -> torch.Tensor:
    """Repetition penalty over prompt and output; presence and frequency penalties over output."""
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.long)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
    if output_ids and (params.presence_penalty or params.frequency_penalty):
        counts = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=logits.shape[0]).to(logits.dtype)
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p: excluded tokens get -inf."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[0]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # keep a token if the mass before it is < top_p (the most likely token is always kept)
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= params.top_p
        logits = logits.masked_fill(torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted), float("-inf"))
    if params.min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return logits


def is_plain_greedy(params: SamplingParams, blocked_token_ids: list[int] | tuple[int, ...] = ()) -> bool:
    """Greedy with nothing that changes the logits and no logprobs asked: `sample` would return
    the row's first argmax and nothing else, so a step can take every such row's in one op."""
    return (
        params.is_greedy
        and not params.logit_bias
        and params.repetition_penalty == 1.0
        and not params.presence_penalty
        and not params.frequency_penalty
        and params.top_logprobs is None
        and not blocked_token_ids
    )


def greedy_tokens(logits: torch.Tensor, rows: list[int]) -> dict[int, SampledToken]:
    """The argmax token of each of `rows` of `logits` [batch, vocab], in one op and one host copy.
    Row by row the same token as `sample` (both take the first maximal index), whatever the batch;
    through numpy, as `first_argmax` says why."""
    if not rows:
        return {}
    values = logits.float().numpy()  # float() costs nothing on float32 logits
    if len(rows) == values.shape[0]:
        picked = np.argmax(values, axis=1).tolist()
    else:
        picked = [int(np.argmax(values[row])) for row in rows]
    return {row: SampledToken(token_id) for row, token_id in zip(rows, picked, strict=True)}


def first_argmax(logits: torch.Tensor) -> int:
    """The first index of the largest of `logits` [vocab], as `torch.argmax` picks it. Through
    numpy: its argmax is vectorized, torch's CPU argmax a scalar loop (a 49,152-token row: 4 us
    against 85 us; 8 rows on two threads: 35 us against 200-670 us)."""
    return int(np.argmax(logits.float().numpy()))


def request_generator(params: SamplingParams) -> torch.Generator | None:
    """A request's own random state: seeded when it asks for a seed, else from the OS; None for greedy
    requests, which draw nothing. Made by the engine on a request's first sampled step and kept by its
    sequence (which stays torch-free), so preemption and batching never change what it draws."""
    if params.seed is not None:
        return torch.Generator().manual_seed(params.seed)
    if params.is_greedy:
        return None
    generator = torch.Generator()
    generator.seed()
    return generator


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    prompt_ids: list[int],
    output_ids: list[int],
    blocked_token_ids: list[int] | tuple[int, ...] = (),
    raw_logits: torch.Tensor | None = None,
) -> SampledToken:
    """Pick the next token from float32 `logits` [vocab]. `blocked_token_ids` (stop tokens before
    min_tokens is reached) can never be chosen. Logprobs describe the model's raw distribution:
    `raw_logits` when `logits` is a grammar-masked copy (masked tokens at -inf, the caller's
    scratch row, which this may overwrite), else `logits` (left as it is). Raises
    UnsampleableRowError when the row has no distribution to draw from (the request's fault)."""
    if raw_logits is None:
        raw_logits, logits = logits, logits.clone()
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
        logits[ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype)
    logits = apply_penalties(logits, params, prompt_ids, output_ids)
    if blocked_token_ids:
        logits[list(blocked_token_ids)] = float("-inf")
    if params.is_greedy:
        token_id = first_argmax(logits)
    else:
        probs = filter_logits(logits, params).softmax(-1)
        total = float(probs.sum())  # NaN anywhere makes the sum NaN: one reduction checks the row
        if not math.isfinite(total) or total <= 0.0:
            raise UnsampleableRowError(
                "sampling parameters (temperature, penalties, logit_bias) left no valid probability "
                "distribution for the next token"
            )
        token_id = int(torch.multinomial(probs, 1, generator=generator))
    if params.top_logprobs is None:
        return SampledToken(token_id)
    # In float64, then reported as float32: the CPU's vector exp and log cannot show in the result.
    logprobs = raw_logits.double().log_softmax(-1).float()
    top = ()
    if params.top_logprobs:
        values, ids = torch.topk(logprobs, params.top_logprobs)
        top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    return SampledToken(token_id, float(logprobs[token_id]), top)
