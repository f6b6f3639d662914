"""Prompt logprobs (each prompt token's logprob given the tokens before it) in the engine.

On the tiny model in float32 they equal a float64 transformers forward of the same weights within
1e-5: float32 carries about 7 significant digits, these logprobs are about -11 and the error
measured is 5e-7, so 1e-5 leaves a margin of twenty without hiding a wrong position or token,
which would be off by whole units. On the batch-invariant kernels they are the same bits alone,
in a batch, however the prompt is chunked and across preemption by recompute.
"""

from __future__ import annotations

import random

import pytest
import torch

from dpgate.v1 import generate_pb2 as pb
from engines.engine import LLMEngine
from engines.model.source import resolve_model
from engines.runner.loader import load
from engines.runner.model_runner import ModelRunner
from engines.sampling.params import InvalidRequestError
from engines.sampling.prompt_logprobs import PromptScoring, rows_per_block, score_blocks, score_prompt_rows
from engines.scheduling.scheduler import SchedulerConfig
from engines.serving.request_builder import ModelLimits, build_sequence
from tests.engines.kernel_choice import on_kernels

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load(resolve_model(str(tiny_model_dir)), torch.float32)


@pytest.fixture(scope="module")
def tiny_on_kernels(tiny_model_dir):
    return on_kernels(load(resolve_model(str(tiny_model_dir)), torch.float32))


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(length)]


def sequence(loaded, request_id: str, prompt_ids: list[int], top_n: int = 2, max_tokens: int = 3):
    request = pb.GenerateRequest(
        request_id=request_id,
        token_ids=pb.TokenIds(ids=prompt_ids),
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        prompt_logprobs=pb.PromptLogprobsOptions(top_n=top_n),
    )
    limits = ModelLimits("m", loaded.config.vocab_size, 1024, loaded.tokenizer.eos_token_ids)
    return build_sequence(request, limits, loaded.tokenizer.tokenizer)


def run(
    loaded,
    prompts: dict[str, list[int]],
    num_blocks: int = 512,
    preempts: bool = False,
    max_tokens: int = 3,
    **scheduler,
) -> dict[str, list]:
    """Run every prompt at once ("a" with 3 output tokens, the others with `max_tokens`); each
    request's prompt logprobs as emitted with its first token."""
    engine = LLMEngine(ModelRunner(loaded, 1024, num_blocks=num_blocks), SchedulerConfig(**scheduler))
    for request_id, ids in prompts.items():
        engine.add(sequence(loaded, request_id, ids, max_tokens=3 if request_id == "a" else max_tokens))
    emitted: dict[str, list] = {}
    while engine.has_work:
        for output in engine.step():
            if output.num_generated_tokens == 1:
                emitted[output.request_id] = output.prompt_logprobs
    assert (engine.scheduler.num_preemptions > 0) == preempts
    return emitted


def reference_logprobs(tiny_model_dir, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 transformers on the same weights: [len(ids) - 1] logprob of token i + 1 given 0..i,
    and the whole log_softmax [len(ids) - 1, vocab]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float64).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    return logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1), logits.log_softmax(-1)


def test_prompt_logprobs_equal_a_float64_reference(tiny, tiny_model_dir):
    ids = prompt(300, seed=1)  # more than one scoring block of the 49k vocabulary (85 rows)
    got = run(tiny, {"a": ids}, max_num_batched_tokens=128)["a"]
    expected, all_logprobs = reference_logprobs(tiny_model_dir, ids)
    assert [t.token_id for t in got] == ids[1:]
    actual = torch.tensor([t.logprob for t in got], dtype=torch.float64)
    assert (actual - expected).abs().max().item() < TOLERANCE
    for position in (0, 150, 298):
        top = all_logprobs[position].topk(2)
        assert [t for t, _ in got[position].top_logprobs] == top.indices.tolist()
        pairs = zip(got[position].top_logprobs, top.values.tolist(), strict=True)
        assert all(abs(lp - want) < TOLERANCE for (_, lp), want in pairs)


def test_prompt_logprobs_are_the_same_bits_alone_batched_chunked_and_preempted(tiny_on_kernels):
    ids = prompt(200, seed=2)
    others = {f"o{i}": prompt(40 + 30 * i, seed=10 + i) for i in range(3)}
    alone = run(tiny_on_kernels, {"a": ids})["a"]
    assert len(alone) == len(ids) - 1
    assert run(tiny_on_kernels, {**others, "a": ids})["a"] == alone
    assert run(tiny_on_kernels, {"a": ids}, max_num_batched_tokens=37)["a"] == alone  # chunks across blocks
    # 20 blocks of 16 hold 320 tokens: four prompts of 30 growing by 30 tokens each and "a" (200,
    # the newest) do not fit together, so "a" is preempted while it prefills and recomputed later.
    short = {f"s{i}": prompt(30, seed=20 + i) for i in range(4)}
    preempted = run(tiny_on_kernels, {**short, "a": ids}, num_blocks=20, preempts=True, max_tokens=30,
                    max_num_batched_tokens=64)  # fmt: skip
    assert preempted["a"] == alone


def test_a_one_token_prompt_has_no_prompt_logprobs_and_off_means_none(tiny):
    assert run(tiny, {"a": [500]})["a"] == []
    seq = sequence(tiny, "b", [500, 600])
    seq.sampling = type(seq.sampling)()  # prompt_logprobs None
    assert seq.prompt_scoring(0, 2) == (0, [])


def test_prompt_logprobs_top_n_is_validated_where_it_enters(tiny):
    with pytest.raises(InvalidRequestError, match=r"prompt_logprobs\.top_n must be in \[0, 20\]"):
        sequence(tiny, "a", [1, 2, 3], top_n=21)


def test_score_blocks_stay_within_one_chunk_and_one_aligned_position_block():
    # chunk 0 scores positions 3..9 (rows 0..6), chunk 1 positions 0..4 (rows 7..11); R = 4
    score_indices = torch.arange(12)
    token_seq = torch.tensor([0] * 7 + [1] * 5, dtype=torch.int32)
    positions = torch.tensor([3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4])
    blocks = [b.tolist() for b in score_blocks(score_indices, token_seq, positions, 4)]
    assert blocks == [[0], [1, 2, 3, 4], [5, 6], [7, 8, 9, 10], [11]]
    assert score_blocks(torch.empty(0, dtype=torch.long), token_seq, positions, 4) == []
    assert rows_per_block(49152) == 85 and rows_per_block(262144) == 16 and rows_per_block(1 << 30) == 1


def test_the_lm_head_only_ever_sees_blocks_of_exactly_r_rows():
    """Memory stays bounded by R rows of logits whatever the prompt length, and every call has
    the same shape (the padding rows are zeros and are never reported)."""
    torch.manual_seed(0)
    head = torch.randn(50, 8, dtype=torch.float32)  # vocab 50, hidden 8
    shapes = []

    def compute_logits(rows: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(rows.shape))
        return rows @ head.T

    hidden = torch.randn(23, 8)
    token_seq, positions = torch.zeros(23, dtype=torch.int32), torch.arange(23)
    scored = torch.arange(2, 21)  # positions 2..20
    blocks = score_blocks(scored, token_seq, positions, 4)
    targets = list(range(19))
    scoring = PromptScoring(targets, [1] * 19, [0] * 19, 1)
    (got,) = score_prompt_rows(compute_logits, hidden, blocks, 4, scoring)
    assert set(shapes) == {(4, 8)} and len(shapes) == 6  # [2,3] [4..7] [8..11] [12..15] [16..19] [20]
    expected = (hidden[2:21] @ head.T).double().log_softmax(-1).float()
    assert [t.token_id for t in got] == targets
    assert [t.logprob for t in got] == [expected[i, targets[i]].item() for i in range(19)]
    assert [t.top_logprobs[0][0] for t in got] == expected.argmax(-1).tolist()
