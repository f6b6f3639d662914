"""Compile the batch-invariant kernels (engines/kernels/csrc) into one shared library, once.

The library is built with the machine's C++ compiler against the installed torch and kept under
the dpgate cache directory, keyed by a hash of the sources, the flags, the compiler and torch, so
a changed source or a new torch builds afresh and an unchanged one loads in milliseconds.
`./dev.sh install` builds it (`python -m engines.kernels`), so a first engine start does not
wait for the compiler; a process that finds no library builds it under a file lock, so engines
started together build it once.

Each instruction set's file is compiled with only that set enabled, and the library picks among
them at run time, so one build runs on every x86-64 CPU (and the scalar file anywhere).

A machine without the compiler (the container image's runtime stage, which gets the cache
directory from its build stage) loads a library built for these sources and this torch by
whichever compiler built it: each build leaves its compiler-independent key beside the library.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dpgate.cache_dir import dpgate_cache_dir

SOURCE_DIR = Path(__file__).parent / "csrc"
LIBRARY_NAME = "libdpgate_kernels.so"
SOURCE_KEY_NAME = "source.key"  # beside each library: _source_key() of its build
# No fast-math and no contraction: the kernels' results are defined by the operations written.
COMMON_FLAGS = ("-O3", "-std=c++20", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-DNDEBUG", "-Wall")
ISA_FLAGS = {
    "isa_scalar.cpp": (),
    "isa_avx2.cpp": ("-mavx2", "-mfma"),
    "isa_avx512.cpp": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma"),
    "isa_avx512_vnni.cpp": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mavx2", "-mfma"),
}


# The translation units that use torch (operators, classes, the thread pool); the isa_* ones do not.
TORCH_SOURCES = ("ops.cpp", "dispatch.cpp", "linear_weights.cpp", "decoder_layer.cpp")


class KernelBuildError(RuntimeError):
    """The compiler is missing or failed; the message carries its output."""


def _compiler() -> str:
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise KernelBuildError(
            f"dpgate's batch-invariant kernels need a C++ compiler ({compiler} was not found): install g++ "
            "or start the engine with --no-batch-invariant"
        )
    return compiler


def _sources() -> list[Path]:
    names = [*TORCH_SOURCES, "isa_scalar.cpp", "int_self_check.cpp"]
    # Most basic instruction set first: where two files instantiate the same template (avx512's
    # and avx512_vnni's float stores), the linker keeps the first object's copy.
    if platform.machine() in ("x86_64", "AMD64"):
        names += ["isa_avx2.cpp", "isa_avx512.cpp", "isa_avx512_vnni.cpp"]
    return [SOURCE_DIR / name for name in names]


def _torch_flags() -> tuple[list[str], list[str]]:
    import torch
    from torch.utils.cpp_extension import include_paths

    lib = Path(torch.__file__).parent / "lib"
    compile_flags = [f"-I{path}" for path in include_paths()]
    compile_flags.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    # at::parallel_for is an OpenMP pragma in ATen's headers: without -fopenmp it runs serially.
    # The library then needs libgomp.so.1, which resolves to the one torch already loaded (same
    # soname, found first through the rpath), so both share one OpenMP thread pool.
    compile_flags.append("-fopenmp")
    link_flags = ["-fopenmp", f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}"]
    return compile_flags, link_flags


def _source_key() -> str:
    """What the library's code depends on apart from the compiler: sources, flags, torch, machine."""
    import torch

    digest = hashlib.sha256()
    for path in [Path(__file__), *sorted(SOURCE_DIR.iterdir())]:  # this file holds the flags
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(repr((COMMON_FLAGS, ISA_FLAGS, torch.__version__, platform.machine())).encode())
    return digest.hexdigest()


def _build_key(compiler: str) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    return hashlib.sha256(f"{_source_key()}\0{version}".encode()).hexdigest()[:16]


def _prebuilt_library() -> Path | None:
    """A library some compiler built for these sources and this torch, or None."""
    wanted = _source_key()
    for key_file in sorted((dpgate_cache_dir() / "kernels").glob(f"*/{SOURCE_KEY_NAME}")):
        library = key_file.parent / LIBRARY_NAME
        if key_file.read_text().strip() == wanted and library.exists():
            return library
    return None


def library_path() -> Path:
    """Where the library for these sources, this compiler and this torch lives (built or not);
    without the compiler, a library built for these sources and this torch by another one."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        prebuilt = _prebuilt_library()
        if prebuilt is not None:
            return prebuilt
    return dpgate_cache_dir() / "kernels" / _build_key(_compiler()) / LIBRARY_NAME


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise KernelBuildError(f"building dpgate kernels failed: {' '.join(command[:3])} ...\n{result.stderr[-4000:]}")


def build(verbose: bool = False) -> Path:
    """Build the library if it is not built yet; returns its path."""
    target = library_path()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same library
        if target.exists():
            return target
        compiler = _compiler()
        torch_compile, torch_link = _torch_flags()
        with tempfile.TemporaryDirectory(dir=target.parent) as work:
            objects = []
            commands = []
            for source in _sources():
                obj = Path(work) / (source.stem + ".o")
                flags = [*COMMON_FLAGS, *ISA_FLAGS.get(source.name, ())]
                if source.name in TORCH_SOURCES:
                    flags += torch_compile
                commands.append([compiler, *flags, "-c", str(source), "-o", str(obj)])
                objects.append(str(obj))
            if verbose:
                print(f"dpgate: compiling {len(commands)} kernel sources into {target}", file=sys.stderr)
            with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
                list(pool.map(_run, commands))
            staged = Path(work) / LIBRARY_NAME
            _run([compiler, "-shared", *objects, "-o", str(staged), *torch_link])
            (target.parent / SOURCE_KEY_NAME).write_text(_source_key() + "\n")
            os.replace(staged, target)  # atomic: readers see no library or a whole one
    return target
