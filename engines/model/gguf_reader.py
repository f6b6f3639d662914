"""A lean GGUF reader: metadata and tensor directory in one pass, tensor bytes by memory map.

`gguf.GGUFReader` builds a numpy view for every element of every metadata array, which costs
seconds on a 49k-token vocabulary. Start-up needs only the key/value metadata, the tensor
directory and the bytes of each tensor once, so this reader parses the header with `struct`
and leaves tensor data in a read-only memory map. Dequantization is `gguf.quants.dequantize`.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types -> struct format of one scalar (strings and arrays are handled apart).
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Where one tensor lives. `shape` is in numpy order (slowest dimension first)."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    offset: int
    num_bytes: int


class GGUFFile:
    """An open GGUF file: `metadata` (key -> value), `tensors` (name -> TensorInfo), and
    `tensor(name)` returning float32 numpy data. Close it (or use it as a context manager)
    to release the memory map."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with self.path.open("rb") as handle:
            if handle.read(4) != GGUF_MAGIC:
                raise GGUFFormatError(f"{self.path} is not a GGUF file (missing the GGUF magic bytes)")
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self.metadata, self.tensors = self._parse()
        except GGUFFormatError:
            self._map.close()
            raise
        except (struct.error, UnicodeDecodeError, ValueError) as error:
            self._map.close()
            raise GGUFFormatError(f"{self.path} is not a readable GGUF file: {error}") from error

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._map.close()

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as stored (quantized blocks), without copying."""
        info = self.tensors[name]
        return np.frombuffer(self._map, dtype=np.uint8, count=info.num_bytes, offset=info.offset)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32 (a copy), shaped as numpy order `info.shape`."""
        info = self.tensors[name]
        data = self.raw(name)
        if info.qtype == GGMLQuantizationType.F32:
            return data.view(np.float32).reshape(info.shape).copy()
        if info.qtype == GGMLQuantizationType.F16:
            return data.view(np.float16).reshape(info.shape).astype(np.float32)
        rows = dequantize(data.reshape(-1, _row_bytes(info)), info.qtype)
        return rows.reshape(info.shape).astype(np.float32, copy=False)

    def _parse(self) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
        cursor = _Cursor(self._map, 4)
        version = cursor.scalar("<I")
        if version not in (2, 3):
            raise GGUFFormatError(f"{self.path} has GGUF version {version}; versions 2 and 3 are supported")
        num_tensors, num_kv = cursor.scalar("<Q"), cursor.scalar("<Q")
        metadata = {}
        for _ in range(num_kv):
            key = cursor.string()
            metadata[key] = cursor.value(cursor.scalar("<I"))
        directory = []
        for _ in range(num_tensors):
            name = cursor.string()
            dims = [cursor.scalar("<Q") for _ in range(cursor.scalar("<I"))]
            qtype = GGMLQuantizationType(cursor.scalar("<I"))
            directory.append((name, tuple(reversed(dims)), qtype, cursor.scalar("<Q")))
        alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-cursor.position // alignment) * alignment
        tensors = {}
        for name, shape, qtype, offset in directory:
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            num_elements = int(np.prod(shape))
            info = TensorInfo(name, shape, qtype, data_start + offset, num_elements // block_size * type_size)
            if info.offset + info.num_bytes > len(self._map):
                raise GGUFFormatError(
                    f"{self.path} is truncated: tensor {name} needs bytes up to {info.offset + info.num_bytes}, "
                    f"the file has {len(self._map)}"
                )
            tensors[name] = info
        return metadata, tensors


def _row_bytes(info: TensorInfo) -> int:
    block_size, type_size = GGML_QUANT_SIZES[info.qtype]
    return info.shape[-1] // block_size * type_size


class _Cursor:
    """Reads little-endian GGUF values from a buffer, advancing a position."""

    def __init__(self, buffer: mmap.mmap, position: int):
        self.buffer = buffer
        self.position = position

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buffer, self.position)
        self.position += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        start = self.position
        self.position += length
        return self.buffer[start : self.position].decode("utf-8", errors="surrogateescape")

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type, count = self.scalar("<I"), self.scalar("<Q")
            if item_type in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[item_type]
                size = struct.calcsize(fmt)
                items = list(struct.unpack_from(f"<{count}{fmt[1]}", self.buffer, self.position))
                self.position += size * count
                return items
            return [self.value(item_type) for _ in range(count)]
        if value_type in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[value_type])
        raise GGUFFormatError(f"unknown GGUF metadata value type {value_type}")
