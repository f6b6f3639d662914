"""Gemma 3 270M against transformers on the same GGUF: greedy tokens identical, logits close,
including a prompt longer than the 512-token sliding window.

float32 on both sides, so any difference is an implementation difference. transformers needs
about a minute on this machine to parse the GGUF (its reader builds a numpy view for every entry
of the 262k-token vocabulary, twice), so the first run saves transformers' own float32
conversion next to the assembled GGUF and later runs load that copy in a second.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from dpgate.cache_dir import dpgate_cache_dir
from dpgate.v1 import generate_pb2
from engines.engine import LLMEngine
from engines.model.source import resolve_model
from engines.runner.loader import load
from engines.runner.model_runner import ModelRunner
from engines.serving.request_builder import ModelLimits, build_sequence
from tests.engines.kernel_choice import load_with_kernels

pytestmark = pytest.mark.e2e  # every test here loads Gemma 3 (and transformers' reference of it)

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<start_of_turn>user\nWhat is 17 times 3?<end_of_turn>\n<start_of_turn>model\n",
    "¿Dónde está la biblioteca? Translate to English:",
]
NUM_TOKENS = 24
COLORS = ["red", "green", "blue", "yellow", "white", "black", "grey"]
ANIMALS = ["fox", "heron", "otter", "badger", "lynx", "crow", "hare", "stag", "wolf", "owl", "seal"]
LONG_PROMPT = " ".join(
    f"Entry {i}: the {COLORS[i % 7]} {ANIMALS[i % 11]} crossed river {i * 7 % 13} at dawn." for i in range(48)
)
LONG_NUM_TOKENS = 16


@pytest.fixture(scope="module")
def plain():
    return load(resolve_model("gemma3-270m"), torch.float32)


@pytest.fixture(scope="module", params=["torch", "batch-invariant"])
def loaded(request, plain):
    """The model on torch's kernels, then on the batch-invariant ones (float32, unquantized)."""
    return plain if request.param == "torch" else load_with_kernels(resolve_model("gemma3-270m"), request.param)


@pytest.fixture(scope="module")
def reference_dir():
    return _reference_dir(resolve_model("gemma3-270m").path)


@pytest.fixture(scope="module")
def expected(plain, reference_dir) -> dict[str, tuple[list[int], torch.Tensor]]:
    """prompt -> transformers' greedy tokens and its last-position logits, one generate each."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(reference_dir), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # compare a fixed number of tokens
    results = {}
    for prompt, num_tokens in [*((p, NUM_TOKENS) for p in PROMPTS), (LONG_PROMPT, LONG_NUM_TOKENS)]:
        ids = plain.tokenizer.tokenizer(prompt).input_ids
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),  # <pad> is id 0; never infer a mask
                max_new_tokens=num_tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        results[prompt] = (out.sequences[0, len(ids) :].tolist(), out.logits[0][0])
    return results


def _reference_dir(gguf: Path) -> Path:
    """A Hugging Face directory holding transformers' float32 load of `gguf`, made once per GGUF
    file and transformers version, written aside and renamed into place."""
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    cached = dpgate_cache_dir() / "references" / hashlib.sha256(key.encode()).hexdigest()[:24]
    if (cached / "config.json").is_file():
        return cached
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    cached.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cached.parent))
    # lm_head is tied to the embedding; transformers ties it again on load.
    state = {name: t.contiguous() for name, t in model.state_dict().items() if name != "lm_head.weight"}
    save_file(state, staging / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config")  # the weights are plain float32 now
    (staging / "config.json").write_text(json.dumps(config, indent=1))
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(staging)
    try:
        staging.rename(cached)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another run got there first
    return cached


def greedy_with_engine(loaded, prompts: list[list[int]], num_tokens: int, max_model_len: int) -> list[list[int]]:
    """All prompts in one engine (batched decode, chunked prefill): greedy outputs in prompt order."""
    engine = LLMEngine(ModelRunner(loaded, max_model_len, num_blocks=len(prompts) * max_model_len // 16))
    limits = ModelLimits("m", loaded.config.vocab_size, max_model_len, loaded.tokenizer.eos_token_ids)
    sequences = []
    for ids in prompts:
        request = generate_pb2.GenerateRequest(
            token_ids=generate_pb2.TokenIds(ids=ids),
            sampling=generate_pb2.SamplingParams(temperature=0.0),
            stopping=generate_pb2.StoppingCriteria(max_tokens=num_tokens, ignore_eos=True),
        )
        sequences.append(build_sequence(request, limits, loaded.tokenizer.tokenizer))
        engine.add(sequences[-1])
    while engine.has_work:
        engine.step()
    return [seq.output_ids for seq in sequences]


def test_prompts_tokenize_with_bos_as_transformers_does(plain, reference_dir):
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(str(reference_dir))
    for prompt in [*PROMPTS, LONG_PROMPT]:
        ids = plain.tokenizer.tokenizer(prompt).input_ids
        assert ids == expected(prompt).input_ids
        assert ids[0] == plain.tokenizer.bos_token_id == 2
    assert plain.tokenizer.eos_token_ids == {1}  # the GGUF names no end-of-turn token


def test_greedy_continuations_match_transformers_token_for_token(loaded, expected):
    prompts = [loaded.tokenizer.tokenizer(prompt).input_ids for prompt in PROMPTS]
    actual = greedy_with_engine(loaded, prompts, NUM_TOKENS, 128)
    for prompt, tokens in zip(PROMPTS, actual, strict=True):
        assert tokens == expected[prompt][0], prompt


def test_prompt_longer_than_the_sliding_window_matches_transformers(loaded, expected):
    ids = loaded.tokenizer.tokenizer(LONG_PROMPT).input_ids
    assert 600 < len(ids) < 800 and loaded.config.sliding_window == 512
    [actual] = greedy_with_engine(loaded, [ids], LONG_NUM_TOKENS, 1024)
    assert actual == expected[LONG_PROMPT][0]


@pytest.mark.parametrize("prompt", [*PROMPTS, LONG_PROMPT], ids=[*map(str, range(len(PROMPTS))), "long"])
def test_last_position_logits_agree_within_1e_3(loaded, expected, prompt):
    ids = loaded.tokenizer.tokenizer(prompt).input_ids
    actual = ModelRunner(loaded, 1024).forward(ids, 0)
    assert actual.shape == expected[prompt][1].shape == (262144,)
    assert (actual - expected[prompt][1]).abs().max().item() < 1e-3


def test_hugging_face_directory_loads_the_same_model(plain, reference_dir):
    from_directory = load(resolve_model(str(reference_dir)), torch.float32)
    assert from_directory.config == plain.config
    expected = dict(plain.model.named_parameters())
    for name, parameter in from_directory.model.named_parameters():
        assert torch.equal(parameter, expected[name]), name
