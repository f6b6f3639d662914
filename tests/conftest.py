"""Fixtures shared by the whole suite, and the `e2e` marker that splits the fast lane from the rest.

A test is `e2e` when it starts a process or loads a real model: its file is named `*_e2e.py`, or
it is marked (`pytestmark = pytest.mark.e2e` in its module, or `@pytest.mark.e2e`).
`./dev.sh test -m "not e2e"` is the fast lane (the inner loop, a few minutes on 2 cores); the full
suite (CI) runs both. The rule is enforced, not only documented: a test outside the e2e set that
starts a process, or builds a model the size of a real one (the tiny random models the tests
make stay allowed), fails with a sentence naming what it did.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_model import make_tiny_llama_dir

E2E_FILE_SUFFIX = "_e2e.py"
# Parameters above which a model counts as real (SmolLM2 has 135M; the tests' tiny random Llama well
# under one million).
REAL_MODEL_PARAMETERS = 10_000_000


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: starts a process or loads a real model (skipped by the fast lane, -m 'not e2e')"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name.endswith(E2E_FILE_SUFFIX):
            item.add_marker(pytest.mark.e2e)


# The test being run (its fixtures' setup included: a module-scoped fixture that loads a model is set
# up inside the first test that asks for it), for the guards below.
_running: list[pytest.Item] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


def _outside_e2e() -> str | None:
    """The node id of the running test when it is not an e2e test, else None (or no test runs)."""
    if not _running or _running[-1].get_closest_marker("e2e") is not None:
        return None
    return _running[-1].nodeid


def pytest_sessionstart(session: pytest.Session) -> None:
    """Outside the e2e set, starting a process is an error that names the test and the command, so
    the fast lane stays fast without anyone policing it."""
    popen_init = subprocess.Popen.__init__

    def guarded_init(self: subprocess.Popen, args: object, *rest: object, **kwargs: object) -> None:
        nodeid = _outside_e2e()
        if nodeid is not None:  # pytest.fail: no `except Exception` on the way can take it for another error
            pytest.fail(
                f"{nodeid} starts a process ({args!r}) but is not an e2e test: "
                f"name its file *{E2E_FILE_SUFFIX} or mark it e2e",
                pytrace=False,
            )
        popen_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded_init


def pytest_collection_finish(session: pytest.Session) -> None:
    """Wrap the one function every model load goes through (engines.model.weights.build_model, as
    the loader bound it too) so that building a real-sized model outside the e2e set fails. The
    tests have imported what they use by now."""
    weights = sys.modules.get("engines.model.weights")
    if weights is None:
        return
    build_model = weights.build_model

    def guarded(config, *args, **kwargs):
        nodeid = _outside_e2e()
        embeddings = config.vocab_size * config.hidden_size
        per_layer = 4 * config.hidden_size**2 + 3 * config.hidden_size * config.intermediate_size
        if nodeid is not None and embeddings + config.num_layers * per_layer > REAL_MODEL_PARAMETERS:
            pytest.fail(
                f"{nodeid} builds a real-sized model ({config.architecture}) but is not an e2e test: "
                f"name its file *{E2E_FILE_SUFFIX} or mark it e2e",
                pytrace=False,
            )
        return build_model(config, *args, **kwargs)

    weights.build_model = guarded
    loader = sys.modules.get("engines.runner.loader")
    if loader is not None:
        loader.build_model = guarded


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
