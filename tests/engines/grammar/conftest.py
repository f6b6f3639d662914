"""A grammar compiler over the default model's real vocabulary (SmolLM2: 49,152 ids, eos 2)."""

from __future__ import annotations

import pytest

from engines.grammar.compiler import GrammarCompiler

SMOLLM2_VOCAB_SIZE = 49152
SMOLLM2_EOS = 2


@pytest.fixture(scope="session")
def smollm2_compiler(smollm2_tokenizer):
    compiler = GrammarCompiler(smollm2_tokenizer, SMOLLM2_VOCAB_SIZE, frozenset({SMOLLM2_EOS}))
    yield compiler
    compiler.shutdown()
