"""Fixtures shared by the whole suite: the packaged default model and a tiny random Llama."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_model import make_tiny_llama_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama_dir(tmp_path_factory.mktemp("tiny-llama"))
