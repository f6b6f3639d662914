"""The kernel library's lookup on a machine without the compiler (a container's runtime stage):
it takes a library built for these sources and this torch, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.kernels.build import LIBRARY_NAME, SOURCE_KEY_NAME, KernelBuildError, _source_key, build, library_path


@pytest.fixture
def no_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory and a compiler name that resolves to nothing."""
    monkeypatch.setenv("DPGATE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    return tmp_path / "kernels"


def _fake_build(kernels_dir: Path, name: str, source_key: str) -> Path:
    """What build() leaves behind: the library and its compiler-independent key."""
    directory = kernels_dir / name
    directory.mkdir(parents=True)
    (directory / SOURCE_KEY_NAME).write_text(source_key + "\n")
    library = directory / LIBRARY_NAME
    library.write_bytes(b"\x7fELF")
    return library


def test_without_compiler_the_matching_prebuilt_library_is_used(no_compiler: Path) -> None:
    _fake_build(no_compiler, "0000000000000000", "another source or torch")
    library = _fake_build(no_compiler, "1111111111111111", _source_key())
    assert library_path() == library
    assert build() == library  # found, so nothing is compiled


def test_without_compiler_a_stale_library_is_refused(no_compiler: Path) -> None:
    _fake_build(no_compiler, "0000000000000000", "another source or torch")
    with pytest.raises(KernelBuildError, match=r"need a C\+\+ compiler"):
        library_path()
