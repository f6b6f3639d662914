"""The model fingerprint (the root of prefix-cache block hashes) tells numerics apart: two engines
share it only when they compute the same keys and values, so a cached prefix is never reused
across weight storage or activation quantization. The instruction set is left out on purpose:
every one gives the scalar reference's bits (avx512_vnni's integer sums included)."""

from __future__ import annotations

from engines.model.fingerprint import model_fingerprint
from engines.model.numerics import Numerics
from engines.model.source import ModelSource, SourceKind


def fingerprint(source: ModelSource, quantization: str, isa: str = "avx512") -> bytes:
    return model_fingerprint(source, Numerics("float32", quantization, True, isa, "test"), 1, 1)


def test_every_quantization_has_its_own_fingerprint_and_the_isa_none(tiny_model_dir):
    source = ModelSource(SourceKind.HF_DIRECTORY, tiny_model_dir, "tiny")
    prints = {q: fingerprint(source, q) for q in ("none", "int8", "gguf", "int-dot")}
    assert len(set(prints.values())) == 4
    assert fingerprint(source, "int-dot", "avx512_vnni") == prints["int-dot"]
    assert fingerprint(source, "int-dot", "scalar") == prints["int-dot"]
