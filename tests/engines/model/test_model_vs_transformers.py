"""The runner against transformers on the same weights: greedy tokens identical, logits close.

float32 on both sides, so any difference is an implementation difference, not rounding noise
from a lower precision. Each test runs on torch's kernels and on the batch-invariant ones
(`--dtype float32 --quantization none`); the second also answers a decode after a chunked
prefill with the very bits of one long prefill.
"""

from __future__ import annotations

import pytest
import torch

from dpgate.v1 import generate_pb2
from engines.engine import LLMEngine
from engines.model.source import resolve_model
from engines.runner.model_runner import ModelRunner
from engines.serving.request_builder import ModelLimits, build_sequence
from tests.engines.kernel_choice import load_with_kernels

pytestmark = pytest.mark.e2e  # every test here loads SmolLM2 and transformers' reference

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "<|im_start|>user\nWhat is 17 times 3?<|im_end|>\n<|im_start|>assistant\n",
    "Water boils at a temperature of",
    "List of planets: Mercury, Venus,",
    "¿Dónde está la biblioteca? Translate to English:",
]
NUM_TOKENS = 32


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoModelForCausalLM

    path = resolve_model("smollm2-135m-instruct").path
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # compare a fixed number of tokens
    return model.eval()


@pytest.fixture(scope="module", params=["torch", "batch-invariant"])
def loaded(request):
    return load_with_kernels(resolve_model("smollm2-135m-instruct"), request.param)


def greedy_with_engine(loaded, prompt_ids: list[int]) -> list[int]:
    engine = LLMEngine(ModelRunner(loaded, 512))
    limits = ModelLimits("m", loaded.config.vocab_size, 512, loaded.tokenizer.eos_token_ids)
    request = generate_pb2.GenerateRequest(
        token_ids=generate_pb2.TokenIds(ids=prompt_ids),
        sampling=generate_pb2.SamplingParams(temperature=0.0),
        stopping=generate_pb2.StoppingCriteria(max_tokens=NUM_TOKENS, ignore_eos=True),
    )
    seq = build_sequence(request, limits, loaded.tokenizer.tokenizer)
    engine.add(seq)
    while engine.has_work:
        engine.step()
    return seq.output_ids


def test_greedy_continuations_match_transformers_token_for_token(loaded, reference):
    tokenizer = loaded.tokenizer.tokenizer
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        with torch.inference_mode():
            # An explicit mask: the prompt contains <|im_end|>, which is also the pad id, and
            # transformers would otherwise mask it out of attention.
            expected = reference.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=NUM_TOKENS,
                do_sample=False,
            )[0, len(ids) :].tolist()
        assert greedy_with_engine(loaded, ids) == expected, prompt


def test_last_position_logits_agree_within_1e_3(loaded, reference):
    ids = loaded.tokenizer.tokenizer(PROMPTS[2]).input_ids
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0, -1]
    runner = ModelRunner(loaded, 64)
    actual = runner.forward(ids, 0)
    assert actual.shape == expected.shape
    assert (actual - expected).abs().max().item() < 1e-3


def test_decode_after_prefill_matches_one_long_prefill(loaded):
    """Cached decoding and chunked prefill must see the same context as a full forward."""
    ids = loaded.tokenizer.tokenizer(PROMPTS[0]).input_ids
    full = ModelRunner(loaded, 64).forward(ids, 0)
    runner = ModelRunner(loaded, 64)
    runner.forward(ids[:2], 0)
    runner.forward(ids[2:-1], 2)
    stepped = runner.forward(ids[-1:], len(ids) - 1)
    if loaded.numerics is not None and loaded.numerics.batch_invariant:
        assert torch.equal(full, stepped)
    else:
        assert (full - stepped).abs().max().item() < 1e-4
