"""The sampler as a pure function: each parameter changes exactly what it should."""

from __future__ import annotations

import math

import pytest
import torch

from engines.sampling.params import InvalidRequestError, SamplingParams
from engines.sampling.sampler import filter_logits, first_argmax, greedy_tokens, is_plain_greedy, sample

VOCAB = 8


def logits_of(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


LOGITS = logits_of(1.0, 3.0, 2.0, 0.5, -1.0, 2.5, 0.0, 1.5)


def draw(params: SamplingParams, logits=LOGITS, prompt=(), output=(), blocked=(), generator=None):
    return sample(logits, params, generator, list(prompt), list(output), list(blocked)).token_id


def test_greedy_takes_the_argmax():
    assert draw(SamplingParams(temperature=0.0)) == 1


def test_blocked_tokens_are_never_chosen():
    assert draw(SamplingParams(temperature=0.0), blocked=[1]) == 5


def test_logit_bias_moves_the_argmax():
    assert draw(SamplingParams(temperature=0.0, logit_bias={6: 10.0})) == 6


def test_repetition_penalty_divides_positive_logits_of_seen_tokens():
    assert draw(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt=[1]) == 5


def test_presence_and_frequency_penalties_count_output_tokens():
    assert draw(SamplingParams(temperature=0.0, presence_penalty=1.0), output=[1]) == 5
    # 3.0 - 2 * 0.3 = 2.4 < 2.5: the twice-generated token loses to token 5
    assert draw(SamplingParams(temperature=0.0, frequency_penalty=0.3), output=[1, 1]) == 5
    assert draw(SamplingParams(temperature=0.0, frequency_penalty=0.3), output=[1]) == 1


def test_top_k_one_and_tiny_top_p_reduce_to_greedy():
    for params in (SamplingParams(top_k=1, seed=1), SamplingParams(top_p=1e-6, seed=1)):
        assert {draw(params, generator=torch.Generator().manual_seed(s)) for s in range(20)} == {1}


def test_top_k_keeps_exactly_k_tokens():
    kept = torch.isfinite(filter_logits(LOGITS, SamplingParams(top_k=3)))
    assert kept.nonzero().flatten().tolist() == [1, 2, 5]


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = LOGITS.softmax(-1)
    p = float(probs[1] + probs[5]) - 1e-4  # the two most likely tokens reach p
    kept = torch.isfinite(filter_logits(LOGITS, SamplingParams(top_p=p)))
    assert kept.nonzero().flatten().tolist() == [1, 5]


def test_min_p_drops_tokens_below_the_fraction_of_the_best():
    kept = torch.isfinite(filter_logits(LOGITS, SamplingParams(min_p=math.exp(-0.75))))
    assert kept.nonzero().flatten().tolist() == [1, 5]  # 2.0 is 1.0 below the best: dropped


def test_same_seed_same_tokens_and_different_seeds_differ():
    params = SamplingParams(temperature=1.0)
    flat = torch.zeros(1000)

    def run(seed: int) -> list[int]:
        generator = torch.Generator().manual_seed(seed)
        return [draw(params, logits=flat, generator=generator) for _ in range(20)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_sampling_follows_the_distribution():
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(VOCAB)
    for _ in range(4000):
        counts[draw(SamplingParams(temperature=1.0), generator=generator)] += 1
    assert torch.allclose(counts / 4000, LOGITS.softmax(-1), atol=0.03)


def test_logprobs_are_the_raw_model_distribution_with_top_alternatives():
    result = sample(LOGITS, SamplingParams(temperature=0.0, top_logprobs=2, logit_bias={6: 10.0}), None, [], [])
    raw = LOGITS.log_softmax(-1)
    assert result.token_id == 6
    assert result.logprob == pytest.approx(float(raw[6]))
    assert [t for t, _ in result.top_logprobs] == [1, 5]
    assert result.top_logprobs[0][1] == pytest.approx(float(raw[1]))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (SamplingParams(temperature=-0.1), "sampling.temperature must be 0 (greedy) or in [0.001, 100]"),
        (SamplingParams(temperature=float("nan")), "sampling.temperature must be 0 (greedy) or in [0.001, 100]"),
        (SamplingParams(top_k=-1), "sampling.top_k must be >= 0 (0 disables it)"),
        (SamplingParams(top_p=0.0), "sampling.top_p must be in (0, 1]"),
        (SamplingParams(top_p=1.5), "sampling.top_p must be in (0, 1]"),
        (SamplingParams(min_p=2.0), "sampling.min_p must be in [0, 1]"),
        (SamplingParams(repetition_penalty=0.0), "sampling.repetition_penalty must be in [0.01, 100]"),
        (SamplingParams(presence_penalty=3.0), "sampling.presence_penalty must be in [-2, 2]"),
        (SamplingParams(frequency_penalty=-3.0), "sampling.frequency_penalty must be in [-2, 2]"),
        (SamplingParams(logit_bias={VOCAB: 1.0}), f"sampling.logit_bias token id {VOCAB} must be < vocab size {VOCAB}"),
        (SamplingParams(logit_bias={1: 101.0}), "sampling.logit_bias value for token 1 must be in [-100, 100]"),
        (SamplingParams(top_logprobs=21), "logprobs.top_n must be in [0, 20]"),
    ],
)
def test_invalid_sampling_params_name_the_field_and_rule(params, message):
    with pytest.raises(InvalidRequestError) as error:
        params.validate(VOCAB)
    assert str(error.value) == message


def test_a_grammar_masked_row_is_sampled_while_logprobs_describe_the_raw_row():
    masked = LOGITS.clone()
    masked[[1, 5]] = float("-inf")  # the grammar forbids the two most likely tokens
    params = SamplingParams(temperature=0.0, logit_bias={2: 0.25}, top_logprobs=1)
    raw_before = LOGITS.clone()
    sampled = sample(masked, params, None, [], [], (), raw_logits=LOGITS)
    assert sampled.token_id == 2
    assert sampled.logprob == pytest.approx(float(LOGITS.double().log_softmax(-1)[2]))
    assert sampled.top_logprobs[0][0] == 1  # the raw distribution's favourite, masked or not
    assert torch.equal(LOGITS, raw_before)  # the raw row is never written; the masked one may be


@pytest.mark.parametrize(
    ("params", "blocked", "plain"),
    [
        (SamplingParams(temperature=0.0), (), True),
        (SamplingParams(temperature=0.0, top_k=5, top_p=0.5), (), True),  # filters only act when sampling
        (SamplingParams(temperature=0.7), (), False),
        (SamplingParams(temperature=0.0), (3,), False),
        (SamplingParams(temperature=0.0, logit_bias={2: 5.0}), (), False),
        (SamplingParams(temperature=0.0, repetition_penalty=1.2), (), False),
        (SamplingParams(temperature=0.0, presence_penalty=0.5), (), False),
        (SamplingParams(temperature=0.0, frequency_penalty=0.5), (), False),
        (SamplingParams(temperature=0.0, top_logprobs=0), (), False),
    ],
)
def test_only_greedy_rows_nothing_else_touches_are_plain(params, blocked, plain):
    assert is_plain_greedy(params, blocked) is plain


def test_greedy_tokens_of_a_batch_are_each_rows_own_sample():
    """Ties included: both take the first maximal index, so a row's token never depends on the batch."""
    batch = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    batch[2, 7] = batch[2, 30] = batch[2].max() + 1.0  # a tie: the first wins
    params = SamplingParams(temperature=0.0)
    alone = {row: sample(batch[row], params, None, [], []).token_id for row in range(6)}
    assert alone[2] == 7
    assert {row: t.token_id for row, t in greedy_tokens(batch, list(range(6))).items()} == alone
    assert {row: t.token_id for row, t in greedy_tokens(batch, [4, 2]).items()} == {4: alone[4], 2: 7}
    assert greedy_tokens(batch, []) == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_numpy_argmax_picks_what_torch_argmax_picks(dtype):
    """Ties (bfloat16 makes many), -inf everywhere but one token, and a row of nothing but -inf."""
    batch = torch.randn(5, 49152, generator=torch.Generator().manual_seed(2)).to(dtype)
    batch[1] = float("-inf")
    batch[1, 40000] = 0.0
    batch[3] = float("-inf")
    batch[4, 11] = batch[4, 20000] = batch[4].max() + 1
    reference = batch.argmax(-1).tolist()
    assert [first_argmax(row) for row in batch] == reference
    assert [t.token_id for t in greedy_tokens(batch, list(range(5))).values()] == reference
    assert {row: t.token_id for row, t in greedy_tokens(batch, [3, 4]).items()} == {3: reference[3], 4: 11}
