"""The gateway's data path as mypyc-compiled C where a current build exists, as Python otherwise
(gateway/compiled.py, gateway/mypyc_build.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gateway import compiled
from gateway.mypyc_build import project_dependencies

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the gateway's and dpgate's sources, and an empty cache directory."""
    root = tmp_path / "project"
    for package in ("gateway", "dpgate"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("DPGATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(compiled.INTERPRETED_ENV, raising=False)
    return root


def fake_build(root: Path) -> Path:
    """What `mypyc_build.build` leaves for `root`'s sources, with empty files for the extensions
    (never loaded here: `find_build` only decides whether they would be)."""
    build = compiled.builds_dir() / compiled.source_key(root)
    extensions = {name: f"{name}.so" for name in [*compiled.COMPILED_MODULES, f"{compiled.GROUP_NAME}__mypyc"]}
    build.mkdir(parents=True)
    for relative in extensions.values():
        (build / relative).touch()
    dependencies = {relative: compiled.file_digest(root / relative) for relative in project_dependencies(root)}
    (build / compiled.MANIFEST_NAME).write_text(json.dumps({"extensions": extensions, "dependencies": dependencies}))
    return build


def test_a_build_for_the_current_sources_is_used(project: Path) -> None:
    build = fake_build(project)
    extensions, status = compiled.find_build(project)
    assert extensions is not None
    assert extensions["gateway.front_door"] == build / "gateway.front_door.so"
    assert status == f"compiled: mypyc build {build.name}"


def test_without_a_build_the_data_path_is_python(project: Path) -> None:
    extensions, status = compiled.find_build(project)
    assert extensions is None
    assert status.startswith("interpreted: no build for these sources")
    assert "python -m gateway.mypyc_build" in status


def test_an_edited_compiled_module_is_never_shadowed_by_its_old_build(project: Path) -> None:
    fake_build(project)
    upstream = project / "gateway" / "upstream.py"
    upstream.write_text(upstream.read_text() + "\n# edited\n")
    extensions, status = compiled.find_build(project)
    assert extensions is None
    assert status.startswith("interpreted: no build for these sources")


def test_an_edited_module_the_compiled_ones_import_retires_the_build(project: Path) -> None:
    # gateway.config's types were compiled into front_door: a build from before an edit is unsafe.
    build = fake_build(project)
    config = project / "gateway" / "config.py"
    config.write_text(config.read_text() + "\n# edited\n")
    extensions, status = compiled.find_build(project)
    assert extensions is None
    assert (
        status
        == f"interpreted: gateway/config.py changed since build {build.name} (`python -m gateway.mypyc_build` rebuilds)"
    )


def test_a_build_missing_a_file_is_not_used(project: Path) -> None:
    build = fake_build(project)
    (build / "gateway.upstream.so").unlink()
    extensions, status = compiled.find_build(project)
    assert extensions is None
    assert status.startswith(f"interpreted: build {build.name} lacks ")


def test_the_dependencies_are_the_project_modules_the_compiled_ones_import() -> None:
    dependencies = project_dependencies()
    # Imported by the compiled modules (directly), and by what they import (routing by config).
    for relative in (
        "gateway/config.py",
        "gateway/engine_client.py",
        "dpgate/engine_token.py",
        "gateway/http2/__init__.py",
    ):
        assert relative in dependencies
    assert "gateway/routing/policies.py" in dependencies
    # The compiled modules are the build's key, not its dependencies; unrelated modules are neither.
    assert "gateway/front_door.py" not in dependencies
    assert "gateway/forwarded_call.py" not in dependencies
    assert "gateway/openai/server.py" not in dependencies
    assert all((ROOT / relative).is_file() for relative in dependencies)


def module_constants_not_final(source: str) -> list[str]:
    """The UPPER_CASE names a module binds at its top level without `Final`."""
    import ast
    import re

    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets = [e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = ast.unparse(node.annotation)
            names = [] if annotation.startswith("Final") else [node.target.id]
        else:
            continue
        found += [name for name in names if re.fullmatch(r"_?[A-Z][A-Z0-9_]*", name)]
    return found


def test_the_compiled_modules_constants_are_final() -> None:
    """Compiled, a module constant that is not Final is a dictionary lookup by name on each read
    (the relay made about fifteen a DATA frame): every one in the compiled modules is Final."""
    source = "A = 1\nB: int = 2\nC: Final = 3\nD: Final[int] = 4\nlower = 5\nE, _F = 6, 7\n"
    assert module_constants_not_final(source) == ["A", "B", "E", "_F"]
    offenders = {
        module: names
        for module in compiled.COMPILED_MODULES
        if (names := module_constants_not_final(compiled.module_path(module).read_text()))
    }
    assert offenders == {}
