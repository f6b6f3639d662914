"""The lean GGUF reader agrees with the gguf package's full reader."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from engines.model.gguf_reader import GGUFFile, GGUFFormatError
from engines.model.source import resolve_model
from tests.support.gguf_files import ONE_TENSOR, cut_short, write_one_tensor_gguf


def test_metadata_and_tensors_match_the_reference_reader():
    path = resolve_model("smollm2-135m-instruct").path
    reference = GGUFReader(path)
    with GGUFFile(path) as gguf:
        assert set(gguf.tensors) == {t.name for t in reference.tensors}
        for key in ("general.architecture", "llama.block_count", "llama.rope.freq_base", "tokenizer.ggml.eos_token_id"):
            assert gguf.metadata[key] == reference.fields[key].contents()
        assert gguf.metadata["tokenizer.ggml.tokens"] == reference.fields["tokenizer.ggml.tokens"].contents()
        for tensor in reference.tensors[:8]:
            expected = dequantize(tensor.data, tensor.tensor_type).reshape(gguf.tensors[tensor.name].shape)
            assert np.array_equal(gguf.tensor(tensor.name), expected), tensor.name


def test_a_file_without_the_magic_is_refused(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(GGUFFormatError, match="missing the GGUF magic bytes"):
        GGUFFile(path)


def test_an_unsupported_version_is_refused(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGUF" + (9).to_bytes(4, "little") + bytes(16))
    with pytest.raises(GGUFFormatError, match="GGUF version 9"):
        GGUFFile(path)



def test_a_file_cut_inside_its_tensor_data_is_refused_naming_the_tensor(tmp_path):
    path = tmp_path / "x.gguf"
    write_one_tensor_gguf(path)
    with GGUFFile(path) as whole:
        assert np.array_equal(whole.tensor("weight"), ONE_TENSOR)
    size = cut_short(path, 100)
    expected = rf"is truncated: tensor weight needs bytes up to {size}, the file has {size - 100}$"
    with pytest.raises(GGUFFormatError, match=expected):
        GGUFFile(path)
