"""The gateway's data path as C, where mypyc built it for exactly these sources; Python otherwise.

The HTTP/2 layer, the relay's upstream side and the front door (`COMPILED_MODULES`) run every
relayed frame through about twenty Python calls; compiled by mypyc (`python -m
gateway.mypyc_build`, which `./dev.sh install` and the container build run) the same code takes
a fifth less CPU a message and a call (docs/performance.md). The build lives under the dpgate
cache directory, never beside the sources: an extension module next to its `.py` would win the
import even after the `.py` was edited. Instead `gateway/__init__.py` calls `install()`, which
looks for the build made from these modules' bytes (and this interpreter), checks that the
project modules they import are unchanged since it was made (their types were compiled in), and
only then puts a finder first on `sys.meta_path` that loads the compiled modules. Any mismatch,
or `DPGATE_INTERPRETED_GATEWAY=1`, leaves the import system alone: the same modules run as
Python, and `status()` says why.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import platform
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from dpgate.cache_dir import dpgate_cache_dir

# The modules mypyc compiles, as one group (calls between them are C calls).
COMPILED_MODULES = (
    "gateway.http2.errors",
    "gateway.http2.frames",
    "gateway.http2.limits",
    "gateway.http2.stream_ids",
    "gateway.http2.stream",
    "gateway.http2.field_block",
    "gateway.http2.header_codec",
    "gateway.http2.header_rules",
    "gateway.http2.sending",
    "gateway.http2.connection",
    "gateway.upstream",
    "gateway.front_door",
    "gateway.grpc_wire",
    "gateway.call_headers",
    "gateway.metadata",
    "gateway.status_table",
    "gateway.forwarded_call",
    "gateway.forwarding",
    "gateway.openai.errors",
    "gateway.openai.fields",
    "gateway.openai.generation_fields",
    "gateway.openai.translate",
    "gateway.openai.responses",
    "gateway.openai.bridge",
    "gateway.openai.server",
)
GROUP_NAME = "dpgate_gateway"  # mypyc's shared library for the group: `dpgate_gateway__mypyc`
MANIFEST_NAME = "manifest.json"
INTERPRETED_ENV = "DPGATE_INTERPRETED_GATEWAY"
PROJECT_ROOT = Path(__file__).resolve().parent.parent  # the directory holding `gateway/`

_status = "interpreted: not looked for yet"


def module_path(module: str, root: Path = PROJECT_ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def source_key(root: Path = PROJECT_ROOT) -> str:
    """What a build is made from, apart from the modules it imports: the compiled modules' bytes,
    the interpreter's ABI and the machine."""
    digest = hashlib.sha256()
    for module in COMPILED_MODULES:
        digest.update(module.encode() + b"\0" + module_path(module, root).read_bytes() + b"\0")
    abi = (sys.implementation.cache_tag, sysconfig.get_config_var("EXT_SUFFIX"), platform.machine())
    digest.update(repr(abi).encode())
    return digest.hexdigest()[:24]


def builds_dir() -> Path:
    return dpgate_cache_dir() / "gateway-mypyc"


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale_dependencies(manifest: dict, root: Path = PROJECT_ROOT) -> list[str]:
    """The imported project modules (relative paths) whose bytes changed since the build."""
    stale = []
    for relative, digest in manifest["dependencies"].items():
        path = root / relative
        if not path.is_file() or file_digest(path) != digest:
            stale.append(relative)
    return stale


class CompiledModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled group's modules (and its shared library) in one build directory."""

    def __init__(self, extensions: dict[str, Path]) -> None:
        self.extensions = extensions

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        extension = self.extensions.get(fullname)
        if extension is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(extension))
        return importlib.util.spec_from_file_location(fullname, extension, loader=loader)


def find_build(root: Path = PROJECT_ROOT) -> tuple[dict[str, Path] | None, str]:
    """The compiled modules of a usable build (name -> extension file), or None and why not."""
    if os.environ.get(INTERPRETED_ENV, "") not in ("", "0"):
        return None, f"interpreted: {INTERPRETED_ENV} is set"
    key = source_key(root)
    build = builds_dir() / key
    try:
        manifest = json.loads((build / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None, f"interpreted: no build for these sources ({key}); `python -m gateway.mypyc_build` makes one"
    stale = stale_dependencies(manifest, root)
    if stale:
        return None, f"interpreted: {stale[0]} changed since build {key} (`python -m gateway.mypyc_build` rebuilds)"
    extensions = {name: build / relative for name, relative in manifest["extensions"].items()}
    missing = [str(path) for path in extensions.values() if not path.is_file()]
    if missing:
        return None, f"interpreted: build {key} lacks {missing[0]}"
    return extensions, f"compiled: mypyc build {key}"


def install() -> str:
    """Load the compiled modules from now on if a build for these sources exists; returns the
    status line. Must run before any of them is imported (`gateway/__init__.py` calls it)."""
    global _status
    already = [name for name in COMPILED_MODULES if name in sys.modules]
    if already:
        _status = f"interpreted: {already[0]} was imported before the compiled build was looked for"
        return _status
    extensions, _status = find_build()
    if extensions is not None:
        sys.meta_path.insert(0, CompiledModuleFinder(extensions))
    return _status


def status() -> str:
    """`compiled: ...` or `interpreted: <why>`: which form of the data path this process runs."""
    return _status


def is_compiled(module: ModuleType) -> bool:
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)
