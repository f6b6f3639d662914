"""Compile the gateway's data path (`compiled.COMPILED_MODULES`) with mypyc, once per source change.

`python -m gateway.mypyc_build` (run by `./dev.sh install` and the container build) type-checks the
modules with mypy, has mypyc turn them into C, and builds one extension per module plus the
group's shared library with the machine's C compiler, in about half a minute on two cores. The
result goes to `<dpgate cache>/gateway-mypyc/<source key>/` with a manifest naming the extension
files and the digests of the project modules the compiled ones import (mypyc compiled their types
in, so a change to one of them retires the build: `compiled.find_build`). A build that exists and
is current is a no-op; processes that build together build once (a file lock).

mypy is a build-time tool here (the `dev` extra, the container's build stage); a machine without
it or without a C compiler runs the same modules as Python.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import io
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gateway.compiled import (
    COMPILED_MODULES,
    GROUP_NAME,
    MANIFEST_NAME,
    PROJECT_ROOT,
    builds_dir,
    file_digest,
    module_path,
    source_key,
    stale_dependencies,
)

# Where the compiled modules' project imports are looked for (third-party modules are not hashed:
# a new version of one is a new install, and `./dev.sh install` rebuilds nothing for it).
PROJECT_PACKAGES = ("gateway", "dpgate")
# mypy checks the compiled modules and reads the rest for their types only.
MYPY_FLAGS = ("--ignore-missing-imports", "--follow-imports=silent", "--no-incremental")


class GatewayBuildError(RuntimeError):
    """mypy or mypyc is missing, a module does not type-check, or the C compiler failed."""


def _module_exists(module: str, root: Path) -> bool:
    return module_path(module, root).is_file() or (root.joinpath(*module.split(".")) / "__init__.py").is_file()


def _module_file(module: str, root: Path) -> Path:
    path = module_path(module, root)
    return path if path.is_file() else root.joinpath(*module.split(".")) / "__init__.py"


def _imported_modules(source: str) -> Iterator[str]:
    """Every module an import statement names, with `from a import b` also as `a.b` (b may be a
    module); imports inside functions and `if TYPE_CHECKING:` count (mypy reads them)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def project_dependencies(root: Path = PROJECT_ROOT) -> list[str]:
    """The project modules the compiled ones import, directly or not, their packages' `__init__`
    files and their type stubs, as paths relative to `root` (the compiled modules themselves
    excluded)."""
    seen: set[str] = set()
    pending = list(COMPILED_MODULES)
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        pending.extend(".".join(parts[:depth]) for depth in range(1, len(parts)))  # its packages
        for name in _imported_modules(_module_file(module, root).read_text()):
            if name.split(".")[0] in PROJECT_PACKAGES and _module_exists(name, root):
                pending.append(name)
    files = {_module_file(module, root) for module in seen - set(COMPILED_MODULES)}
    stubs = {path.with_suffix(".pyi") for path in files if path.with_suffix(".pyi").is_file()}  # (dpgate/v1's)
    return sorted(str(path.relative_to(root)) for path in files | stubs)


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    # mypy and setuptools read configuration from the working directory: an empty one has none.
    previous = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def _compile(work: Path, root: Path, verbose: bool) -> dict[str, str]:
    """Run mypyc and the C compiler in `work`; returns module name -> extension path relative to
    `work/out`."""
    try:
        from mypyc.build import mypycify
        from setuptools import Distribution
    except ImportError as error:
        raise GatewayBuildError(f"compiling the gateway needs mypy (pip install mypy): {error}") from error
    paths = [str(module_path(module, root)) for module in COMPILED_MODULES]
    output = io.StringIO()  # mypy's and the compiler's messages: shown with --verbose or a failure
    with _working_directory(work), contextlib.redirect_stdout(sys.stdout if verbose else output):
        try:
            extensions = mypycify(
                [*paths, *MYPY_FLAGS], only_compile_paths=paths, target_dir=str(work / "c"), group_name=GROUP_NAME
            )
        except SystemExit:  # mypyc exits after printing mypy's errors
            raise GatewayBuildError(f"mypy rejected the gateway's modules:\n{output.getvalue()[-4000:]}") from None
        distribution = Distribution({"name": "dpgate-gateway-compiled", "ext_modules": extensions})
        distribution.script_args = ["build_ext", "--build-lib", str(work / "out"), "--build-temp", str(work / "tmp")]
        try:
            distribution.parse_command_line()
            distribution.run_commands()
        except (SystemExit, Exception) as error:  # distutils reports a compiler failure as either
            raise GatewayBuildError(
                f"the C compiler failed on the gateway's mypyc output ({error}):\n{output.getvalue()[-4000:]}"
            ) from None
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built = {}
    for name in [*COMPILED_MODULES, f"{GROUP_NAME}__mypyc"]:
        relative = Path(*name.split(".")).with_suffix("").as_posix() + suffix
        if not (work / "out" / relative).is_file():
            raise GatewayBuildError(f"mypyc's build has no {relative}")
        built[name] = relative
    return built


def build(verbose: bool = False, root: Path = PROJECT_ROOT) -> Path:
    """Build the compiled modules for the current sources unless a current build exists; returns
    its directory."""
    key = source_key(root)
    target = builds_dir() / key
    manifest_path = target / MANIFEST_NAME

    def is_current() -> bool:
        try:
            return not stale_dependencies(json.loads(manifest_path.read_text()), root)
        except (OSError, ValueError):
            return False

    if is_current():
        return target
    builds_dir().mkdir(parents=True, exist_ok=True)
    with open(builds_dir() / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same sources
        if is_current():
            return target
        dependencies = {relative: file_digest(root / relative) for relative in project_dependencies(root)}
        with tempfile.TemporaryDirectory(dir=builds_dir()) as work_name:
            work = Path(work_name)
            # mypy reads a copy of the modules it needs: where they are installed (the container's
            # site-packages) it would take the whole directory for the project and refuse the
            # other packages there as shadowing the ones it ships.
            sources = work / "src"
            compiled_files = [str(module_path(module, root).relative_to(root)) for module in COMPILED_MODULES]
            for relative in [*compiled_files, *dependencies]:
                (sources / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(root / relative, sources / relative)
            extensions = _compile(work, sources, verbose)
            # The extension files and the manifest move in as one directory: a reader sees a whole
            # build or none.
            staged = work / "build"
            staged.mkdir()
            for relative in extensions.values():
                (staged / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(work / "out" / relative, staged / relative)
            manifest = {"extensions": extensions, "dependencies": dependencies, "python": sys.version}
            (staged / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            if target.exists():  # an older build of the same sources, made before a dependency changed
                shutil.rmtree(target)
            staged.rename(target)
    return target


def main() -> int:
    verbose = "--verbose" in sys.argv[1:]
    try:
        print(build(verbose=verbose))
    except GatewayBuildError as error:
        print(f"dpgate: {error}; the gateway runs its data path as Python", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
