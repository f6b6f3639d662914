"""Reads the container files as Docker and compose do, for tests that run their commands without Docker.

Only the parts the tests use: the Dockerfile's last stage (ENV, ENTRYPOINT, HEALTHCHECK), and
compose.yaml with its `${NAME}` / `${NAME:-default}` / `${NAME-default}` interpolation. Anything
the reader does not understand fails loudly, so a construct added later cannot be silently skipped.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


@dataclass(slots=True)
class ImageSpec:
    """What the runtime stage of the Dockerfile says about the processes it starts."""

    entrypoint: list[str]
    env: dict[str, str] = field(default_factory=dict)
    healthcheck: list[str] = field(default_factory=list)
    exposed: set[int] = field(default_factory=set)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    logical, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    pairs = []
    for line in logical:
        name, _, rest = line.strip().partition(" ")
        pairs.append((name.upper(), rest.strip()))
    return pairs


def _env_pairs(arguments: str) -> dict[str, str]:
    pairs = {}
    for word in shlex.split(arguments):
        name, sep, value = word.partition("=")
        if not sep:
            raise ValueError(f"Dockerfile ENV {arguments!r}: only the KEY=VALUE form is understood")
        pairs[name] = value
    return pairs


def read_dockerfile(path: Path = ROOT / "Dockerfile") -> ImageSpec:
    """The last stage's ENV, EXPOSE, ENTRYPOINT and HEALTHCHECK command (exec forms only)."""
    spec: ImageSpec | None = None
    for name, arguments in _instructions(path.read_text()):
        if name == "FROM":
            spec = ImageSpec(entrypoint=[])
        elif spec is None:
            continue
        elif name == "ENV":
            spec.env.update(_env_pairs(arguments))
        elif name == "EXPOSE":
            spec.exposed.update(int(word.split("/")[0]) for word in arguments.split())
        elif name == "ENTRYPOINT":
            spec.entrypoint = json.loads(arguments)
        elif name == "HEALTHCHECK":
            options, _, command = arguments.partition("CMD ")
            if not command or options.strip().upper() == "NONE":
                raise ValueError("Dockerfile HEALTHCHECK must be `HEALTHCHECK [OPTIONS] CMD [...]`")
            spec.healthcheck = json.loads(command)
    if spec is None or not spec.entrypoint:
        raise ValueError("Dockerfile has no ENTRYPOINT in its last stage")
    return spec


_VARIABLE = re.compile(r"\$\$|\$\{([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_SIMPLE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])(.*))?$", re.DOTALL)


def interpolate(text: str, environment: dict[str, str]) -> str:
    """compose's variable substitution for the forms compose.yaml uses."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group(2) is not None:
            return environment.get(match.group(2), "")
        inner = _SIMPLE.match(match.group(1))
        if inner is None:
            raise ValueError(f"compose.yaml: {match.group(0)!r} is not a substitution this reader understands")
        name, operator, default = inner.groups()
        value = environment.get(name)
        if operator == ":-" and not value:
            return default
        if operator == "-" and value is None:
            return default
        if operator in (":?", "?") and (value is None or (operator == ":?" and not value)):
            raise ValueError(f"compose.yaml: {name} must be set: {default}")
        return value or ""

    return _VARIABLE.sub(replace, text)


def _interpolate_tree(node: object, environment: dict[str, str]) -> object:
    if isinstance(node, str):
        return interpolate(node, environment)
    if isinstance(node, list):
        return [_interpolate_tree(item, environment) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate_tree(value, environment) for key, value in node.items()}
    return node


def read_compose(environment: dict[str, str], path: Path = ROOT / "compose.yaml") -> dict[str, dict]:
    """compose.yaml's services after interpolation with `environment` (YAML merge keys resolved)."""
    document = yaml.safe_load(path.read_text())
    return _interpolate_tree(document["services"], environment)


def list_form(command: object, where: str) -> list[str]:
    """A command as compose runs it: lists as given; strings are refused (their splitting is shell-like)."""
    if not isinstance(command, list) or not all(isinstance(word, str) for word in command):
        raise ValueError(f"{where} must be a list of strings")
    return command


def service_environment(service: dict, name: str) -> dict[str, str]:
    environment = service.get("environment", {})
    if not isinstance(environment, dict):
        raise ValueError(f"compose service {name}: environment must be a mapping")
    return {key: str(value) for key, value in environment.items()}


def healthcheck_command(service: dict, name: str) -> list[str]:
    """The healthcheck's command without compose's leading CMD."""
    test = list_form(service.get("healthcheck", {}).get("test"), f"compose service {name} healthcheck.test")
    if test[:1] != ["CMD"]:
        raise ValueError(f"compose service {name}: healthcheck.test must start with CMD")
    return test[1:]


def console_script(program: str) -> tuple[str, str]:
    """(module, function) of a [project.scripts] entry in pyproject.toml."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts[program].partition(":")
    return module, function
