"""The fused decoder layer (engines/model/fused.py) gives the module path's bits: the same
logits, compared with torch.equal, for both packaged models, on every instruction set, in
prefill chunks, decodes and mixed steps, on int8 and on the GGUF's own blocks (with float32 or,
under int-dot, int8 activations)."""

from __future__ import annotations

import pytest
import torch

from engines import kernels
from engines.kernels.cpu import cpu_info
from engines.model.fused import fuse_decoder_layers, unfuse_decoder_layers
from engines.model.numerics import KERNEL_ISAS, choose_numerics
from engines.model.source import resolve_model
from engines.runner.loader import load_for_serving
from engines.runner.model_runner import ChunkInput, ModelRunner

FASTEST = kernels.supported_isas()[-1]


def served(model: str, quantization: str = "int8", isa: str = FASTEST, dtype: str = "auto"):
    isas = tuple(name for name in KERNEL_ISAS[KERNEL_ISAS.index(isa) :] if name in kernels.supported_isas())
    return load_for_serving(resolve_model(model), choose_numerics(dtype, quantization, True, cpu_info(), isas))


def steps(vocab: int) -> list[list[ChunkInput]]:
    """A prompt in two chunks beside another's prefill, then decodes of both with a third joining."""
    g = torch.Generator().manual_seed(7)

    def ids(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    a, b, c = range(0, 4), range(4, 8), range(8, 12)
    return [
        [ChunkInput(ids(21), 0, a, samples=False), ChunkInput(ids(37), 0, b)],
        [ChunkInput(ids(19), 21, a), ChunkInput(ids(1), 37, b)],
        [ChunkInput(ids(1), 40, a), ChunkInput(ids(1), 38, b), ChunkInput(ids(5), 0, c)],
        [ChunkInput(ids(1), 41, a), ChunkInput(ids(1), 39, b), ChunkInput(ids(1), 5, c)],
    ]


def logits_of(loaded, fused: bool) -> list[torch.Tensor]:
    if fused:
        assert fuse_decoder_layers(loaded.model, loaded.numerics.isa) == loaded.config.num_layers
    else:
        unfuse_decoder_layers(loaded.model)
    runner = ModelRunner(loaded, 128, num_blocks=16, block_size=16)
    return [runner.execute(chunks) for chunks in steps(loaded.config.vocab_size)]


@pytest.mark.parametrize(
    "model, quantization",
    [
        ("smollm2-135m-instruct", "int8"),
        ("smollm2-135m-instruct", "gguf"),
        ("smollm2-135m-instruct", "int-dot"),
        ("gemma3-270m", "int8"),
    ],
)
@pytest.mark.e2e
def test_the_fused_layer_gives_the_module_paths_bits(model, quantization):
    loaded = served(model, quantization)
    assert all(layer.fused is not None for layer in loaded.model.layers), "the served default runs fused"
    fused, modules = logits_of(loaded, True), logits_of(loaded, False)
    for step, (a, b) in enumerate(zip(fused, modules, strict=True)):
        assert torch.equal(a, b), f"step {step}: fused and module logits differ by {(a - b).abs().max()}"


@pytest.mark.parametrize("isa", kernels.supported_isas())
def test_every_instruction_set_fuses_to_the_same_bits(isa, tiny_model_dir):
    loaded = served(str(tiny_model_dir), isa=isa)
    fused, modules = logits_of(loaded, True), logits_of(loaded, False)
    assert all(torch.equal(a, b) for a, b in zip(fused, modules, strict=True))


def test_bfloat16_models_keep_the_module_path(tiny_model_dir):
    loaded = served(str(tiny_model_dir), dtype="bfloat16")
    assert all(layer.fused is None for layer in loaded.model.layers)
    assert fuse_decoder_layers(served(str(tiny_model_dir)).model, FASTEST) == 2


def test_bad_arguments_are_refused_with_the_rule(tiny_model_dir):
    loaded = served(str(tiny_model_dir))  # hidden 64, 2 kv heads of 16
    fused = loaded.model.layers[0].fused
    cache = torch.zeros(loaded.config.num_layers, 2, 64, 16)
    table = torch.zeros(1, 4, dtype=torch.int32)
    args = (torch.ones(1, 1, 16), torch.ones(1, 1, 16), cache, cache.clone(), torch.tensor([0]), table,
            torch.zeros(1, dtype=torch.int32), torch.tensor([0]), 16)  # fmt: skip
    assert fused.forward(torch.ones(1, 64), *args).shape == (1, 64)
    with pytest.raises(RuntimeError, match="hidden must be float32"):
        fused.forward(torch.ones(1, 64, dtype=torch.bfloat16), *args)
    with pytest.raises(RuntimeError, match="slot_mapping out of range"):
        fused.forward(torch.ones(1, 64), *args[:4], torch.tensor([64]), *args[5:])
    with pytest.raises(RuntimeError, match="caches must be float32"):
        fused.forward(torch.ones(1, 64), *args[:2], cache[:, :1], cache[:, :1], *args[4:])
