"""What makes an engine's keys and values what they are, as bytes: the root of its prefix-cache
block hashes (engines/kv/prefix_hash.py), published in GetServerInfoResponse.

Two engines get the same fingerprint only when they would compute the same keys and values for
the same token ids: the same checkpoint files byte for byte (weights and, inside them or beside
them, the tokenizer), the same numerics (activation dtype, weight quantization, kernels) and the
same decode-context-parallel split (which orders the attention sums). Tensor parallelism is left
out on purpose: T ranks give T=1's bits (docs/engine.md).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from engines.model.numerics import Numerics
from engines.model.source import ModelSource, SourceKind

_READ_BYTES = 1 << 22


def model_fingerprint(source: ModelSource, numerics: Numerics, dcp_size: int, interleave: int) -> bytes:
    """SHA-256 over the checkpoint files' own SHA-256s, in name order, the numerics and the DCP split
    (`dcp_size` ranks, `interleave` tokens a turn): plain integers, so the model room needs no
    parallel plan."""
    digest = hashlib.sha256(b"dpgate-model-fingerprint-v1\0")
    for path in _checkpoint_files(source):
        digest.update(path.name.encode() + b"\0" + _file_digest(path))
    kernels = f"invariant:{numerics.isa is not None}" if numerics.batch_invariant else "torch"
    digest.update(
        f"\0{numerics.dtype}\0{numerics.quantization}\0{kernels}\0dcp={dcp_size}/{interleave}".encode()
    )
    return digest.digest()


def _checkpoint_files(source: ModelSource) -> list[Path]:
    if source.kind is SourceKind.GGUF:
        return [source.path]
    return sorted(p for p in source.path.iterdir() if p.is_file() and not p.name.startswith("."))


def _file_digest(path: Path) -> bytes:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_READ_BYTES):
            digest.update(chunk)
    return digest.digest()
