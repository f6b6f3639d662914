"""Small GGUF files written by tests, for the reader's and the engine's refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

ONE_TENSOR = np.arange(256, dtype=np.float32).reshape(4, 64)


def write_one_tensor_gguf(path: Path) -> None:
    """A valid GGUF with one float32 tensor, `weight`, and no other metadata than the architecture."""
    writer = GGUFWriter(path, "llama")
    writer.add_tensor("weight", ONE_TENSOR)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def cut_short(path: Path, num_bytes: int) -> int:
    """Drop the last `num_bytes` of the file, as an interrupted copy would; returns the old size."""
    size = path.stat().st_size
    with path.open("r+b") as handle:
        handle.truncate(size - num_bytes)
    return size
