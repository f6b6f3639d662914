"""Find or build llama.cpp's Python bindings (llama-cpp-python) for bench/engine_vs_llamacpp.py.

llama.cpp is the peer a CPU user would run instead of dpgate, so the bench measures it in the same
run. It is never part of dpgate's install: the first bench run compiles llama-cpp-python's sdist
from PyPI once, natively for this CPU, into dpgate's cache directory, and every later run imports
it from there (sys.path) without touching the network or the compiler.

    <cache>/llamacpp/<version>-<isa>-<hash of the CPU's flags>/llama_cpp/...

One build per CPU flag set and ISA cap: `isa="native"` lets ggml use everything the CPU has
(-march=native); `isa="avx2"` turns AVX-512 off, to emulate an AVX2-only machine on an AVX-512 one
(ggml has no run-time switch for it); `isa="no-amx"` turns on each x86 extension the CPU lists
except AMX, for CPUs where ggml's AMX kernels die (SIGILL in `tileloadd` on an Intel Xeon whose
kernel grants AMX): bench/engine_vs_llamacpp.py runs a prompt through the native build at start-up
and falls back to this one when that kills the process, since a CPU flag did not prove it works.
A build that fails leaves no directory behind, so the next run tries again instead of importing
half a package.

    python bench/llamacpp_build.py [--isa native|avx2|no-amx]   # build now (minutes), print the path
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
ISAS = ("native", "avx2", "no-amx")

# ggml's CMake options per ISA cap; the common part keeps the build to the CPU library alone.
_COMMON_CMAKE = ("-DGGML_OPENMP=ON", "-DLLAVA_BUILD=OFF", "-DGGML_BLAS=OFF", "-DLLAMA_CURL=OFF")
_ISA_CMAKE = {
    "native": ("-DGGML_NATIVE=ON",),
    "avx2": (
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
        "-DGGML_BMI2=ON",
        "-DGGML_AVX512=OFF",
        "-DGGML_AVX512_VBMI=OFF",
        "-DGGML_AVX512_VNNI=OFF",
        "-DGGML_AVX512_BF16=OFF",
        "-DGGML_AVX_VNNI=OFF",
        "-DGGML_AMX_TILE=OFF",
        "-DGGML_AMX_INT8=OFF",
        "-DGGML_AMX_BF16=OFF",
    ),
}


@dataclass(frozen=True, slots=True)
class LlamaCppBuild:
    """Where one build lives and how it was (or will be) made."""

    directory: Path
    version: str
    isa: str
    cmake_args: tuple[str, ...]

    @property
    def is_built(self) -> bool:
        """A finished build has the package, its shared library and its pure-Python dependency."""
        package = self.directory / "llama_cpp"
        has_library = (package / "__init__.py").is_file() and any((package / "lib").glob("libllama*"))
        return has_library and (self.directory / "diskcache" / "__init__.py").is_file()


# ggml's x86 options for the "no-amx" build, by the /proc/cpuinfo flag that allows each.
_NO_AMX_OPTIONS = (
    ("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"), ("bmi2", "GGML_BMI2"),
    ("avx512f", "GGML_AVX512"), ("avx512vbmi", "GGML_AVX512_VBMI"), ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"), ("avx_vnni", "GGML_AVX_VNNI"),
)  # fmt: skip
_AMX_OFF = ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")


def cmake_args(isa: str, cpu_flags: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """ggml's CMake options for `isa`; "no-amx" needs the CPU's flags (each extension it has, on)."""
    if isa == "no-amx":
        options = tuple(f"-D{option}={'ON' if flag in cpu_flags else 'OFF'}" for flag, option in _NO_AMX_OPTIONS)
        return (*_COMMON_CMAKE, "-DGGML_NATIVE=OFF", *options, *_AMX_OFF)
    if isa not in _ISA_CMAKE:
        raise ValueError(f"isa must be one of {', '.join(ISAS)}, not {isa!r}")
    return _COMMON_CMAKE + _ISA_CMAKE[isa]


def flags_hash(cpu_flags: frozenset[str], isa: str) -> str:
    """Names the build by what it was compiled for: a native build is only valid on the same flags."""
    text = isa + ":" + " ".join(sorted(cpu_flags)) + ":" + " ".join(cmake_args(isa, cpu_flags))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build_location(
    cache_dir: Path, cpu_flags: frozenset[str], isa: str = "native", version: str = LLAMA_CPP_PYTHON_VERSION
) -> LlamaCppBuild:
    directory = cache_dir / "llamacpp" / f"{version}-{isa}-{flags_hash(cpu_flags, isa)}"
    return LlamaCppBuild(directory, version, isa, cmake_args(isa, cpu_flags))


# What `import llama_cpp` needs beside numpy, jinja2 and typing-extensions (already in dpgate's
# environment): installed into the build directory too, so nothing is added to the environment.
PURE_PYTHON_DEPENDENCIES = ("diskcache==5.6.3",)


def pip_command(target: Path, requirements: list[str], python: str = sys.executable) -> list[str]:
    """pip without its wheel cache: the cache keys a built wheel by name and version alone, so a
    second build with other CMAKE_ARGS (the AVX2 one beside the native one) would reuse the first."""
    return [python, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--target", str(target), *requirements]


def build(location: LlamaCppBuild, jobs: int = 2, log=print, run=subprocess.run) -> float:
    """Compile into a scratch directory beside the final one and rename it on success, so a build
    that fails or is interrupted never looks finished. Returns the seconds it took."""
    scratch = location.directory.with_name(location.directory.name + f".partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    cmake = " ".join(location.cmake_args)
    env = dict(os.environ, CMAKE_ARGS=cmake, CMAKE_BUILD_PARALLEL_LEVEL=str(jobs))
    log(f"building llama-cpp-python {location.version} ({location.isa}) in {location.directory}: CMAKE_ARGS={cmake!r}")
    started = time.monotonic()
    try:
        requirements = [f"llama-cpp-python=={location.version}", *PURE_PYTHON_DEPENDENCIES]
        run([*pip_command(scratch, requirements), "--no-binary", "llama-cpp-python"], env=env, check=True)
        if not LlamaCppBuild(scratch, location.version, location.isa, location.cmake_args).is_built:
            raise RuntimeError(f"pip finished but left no llama_cpp package with its library in {scratch}")
        scratch.rename(location.directory)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return time.monotonic() - started


def location_for(isa: str = "native", cache_dir: Path | None = None) -> LlamaCppBuild:
    """Where this CPU's build for `isa` lives (built or not)."""
    from dpgate.cache_dir import dpgate_cache_dir
    from engines.kernels.cpu import cpu_info

    return build_location(cache_dir or dpgate_cache_dir(), cpu_info().flags, isa)


def find_or_build(isa: str = "native", cache_dir: Path | None = None, jobs: int = 2, log=print) -> LlamaCppBuild:
    """The cached build for this CPU and ISA cap, compiled first if it is not there yet."""
    location = location_for(isa, cache_dir)
    if not location.is_built:
        seconds = build(location, jobs, log)
        log(f"built llama-cpp-python in {seconds:.0f} s")
    return location


def import_llama_cpp(directory: Path):
    """The `llama_cpp` module built in `directory` (first on sys.path, so an installed copy never wins)."""
    sys.path.insert(0, str(directory))
    import llama_cpp

    if not Path(llama_cpp.__file__).resolve().is_relative_to(directory.resolve()):
        raise ImportError(f"llama_cpp was imported from {llama_cpp.__file__}, not from {directory}")
    return llama_cpp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", choices=ISAS, default="native")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (CMAKE_BUILD_PARALLEL_LEVEL)")
    args = parser.parse_args()
    print(find_or_build(args.isa, jobs=args.jobs).directory)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
