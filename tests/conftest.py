"""Fixtures shared by the whole suite: the packaged default model and a tiny random Llama."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_model import make_tiny_llama_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's server processes write their logs (read back when a test fails)."""
    return tmp_path_factory.mktemp("process-logs")


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The default model's tokenizer, built by transformers from the packaged GGUF."""
    from engines.model.source import resolve_model
    from engines.model.tokenizer import load_tokenizer

    return load_tokenizer(resolve_model("smollm2-135m-instruct")).tokenizer
