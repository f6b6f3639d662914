"""`--config FILE`: a TOML file of flag values for `dpgate gateway`, `dpgate engine` and `dpgate serve`.

Each key is a flag of the command without its leading dashes (`max-num-seqs`; `max_num_seqs` is
accepted too). The file's values are turned into the argv tokens the flags would be
(`--max-num-seqs=64`) and parsed by the command's own argparse parser, so a file value gets
exactly the type and choice checks, and later the same `GatewayConfig`/`EngineConfig`
validation, as the flag. Flags on the command line override the file, a repeatable flag
(`--engine`, `--api-key`) as a whole. Values: a string, integer or float for a flag that takes a
value, a list of them for a repeatable flag, `true`/`false` for a switch (`access-log = false`;
`batch-invariant = false` is `--no-batch-invariant`).

Errors are one sentence naming the file and the key: an unknown key, a table where a value
belongs, or the sentence argparse gives the flag. A later validation error about a flag that
only the file set is attributed to the file's key by `attribute`.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Sequence
from typing import Any

CONFIG_DEST = "config"
# Set on the parsed namespace: flag -> the key of the file that set it (and was not overridden).
SOURCES_ATTRIBUTE = "config_sources"
_UNSET = object()
_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")


class ConfigFileError(ValueError):
    """A config file that cannot be used; the message is one sentence naming the file and key."""


class _ParseError(Exception):
    """What argparse would have printed before exiting."""


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file of flag values, keys named as the flags without dashes; flags given here override it",
    )


def parse_args_with_config(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse `argv` over the values of its `--config` file; exits 2 with one sentence on bad input."""
    command_line = _explicit_values(parser, list(argv))  # argparse exits 2 itself on a bad flag
    path = command_line.get(CONFIG_DEST)
    if path is None:
        namespace = parser.parse_args(list(argv))
        setattr(namespace, SOURCES_ATTRIBUTE, {})
        return namespace
    try:
        tokens, keys = config_tokens(parser, path)
    except ConfigFileError as error:
        parser.error(str(error))
    try:
        from_file = _explicit_values(parser, tokens, raise_errors=True)
    except _ParseError as error:
        parser.error(_name_the_key(str(error), path, keys))
    namespace = parser.parse_args([])
    sources: dict[str, str] = {}
    for dest, value in from_file.items():
        if dest not in command_line:
            setattr(namespace, dest, value)
            sources[keys[dest][0]] = f"key {keys[dest][1]!r} in {path}"
    for dest, value in command_line.items():
        setattr(namespace, dest, value)
    setattr(namespace, SOURCES_ATTRIBUTE, sources)
    return namespace


def config_tokens(parser: argparse.ArgumentParser, path: str) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """The argv tokens a config file stands for, and dest -> (flag, key) for each key it sets."""
    table = _load(path)
    options = _options(parser)
    tokens: list[str] = []
    keys: dict[str, tuple[str, str]] = {}
    for key, value in table.items():
        if key.replace("_", "-") == CONFIG_DEST:
            raise ConfigFileError(f"{path}: key {key!r} is refused: a config file cannot name another.")
        option, action = options.get(key.replace("_", "-"), (None, None))
        if action is None or option is None:
            raise ConfigFileError(f"{path}: unknown key {key!r}: it is not a flag of {parser.prog}.")
        where = f"{path}: key {key!r}"
        if isinstance(value, dict):
            raise ConfigFileError(f"{where} must be a value, not a table.")
        tokens += _tokens_for(option, action, value, where)
        keys[action.dest] = (action.option_strings[0], key)
    return tokens, keys


def attribute(message: str, namespace: argparse.Namespace) -> str:
    """`message` with the config key that set its first flag, when only the file set that flag."""
    sources: dict[str, str] = getattr(namespace, SOURCES_ATTRIBUTE, {})
    match = _FLAG.search(message)
    if match is None or match.group() not in sources:
        return message
    body = message[:-1] if message.endswith(".") else message
    return f"{body} (set by {sources[match.group()]})."


def _name_the_key(message: str, path: str, keys: dict[str, tuple[str, str]]) -> str:
    """argparse's sentence about a flag, prefixed with the file and the key that gave it."""
    key_of = {flag: key for flag, key in keys.values()}
    match = _FLAG.search(message)
    flag = match.group() if match else None
    if flag is not None and flag.startswith("--no-"):
        flag = "--" + flag[5:]
    where = f"{path}: key {key_of[flag]!r}" if flag in key_of else path
    return f"{where}: {message}"


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as error:
        raise ConfigFileError(f"--config {path!r} cannot be read ({error.strerror}).") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigFileError(f"--config {path!r} is not valid TOML ({error}).") from None


def _options(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.Action]]:
    """Long flag name without dashes -> (the flag, its action); --help and --config are no keys."""
    options = {}
    for action in parser._actions:
        if action.dest in ("help", CONFIG_DEST) or isinstance(action, argparse._VersionAction):
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                options[option[2:]] = (option, action)
    return options


def _tokens_for(option: str, action: argparse.Action, value: Any, where: str) -> list[str]:
    if action.nargs == 0:  # a switch
        if not isinstance(value, bool):
            raise ConfigFileError(f"{where} must be true or false, as {option} takes no value.")
        if isinstance(action, argparse.BooleanOptionalAction):
            positive = option if not option.startswith("--no-") else "--" + option[5:]
            negative = "--no-" + positive[2:]
            return [positive if value == (option == positive) else negative]
        return [option] if value else []
    if isinstance(action, argparse._AppendAction):
        values = value if isinstance(value, list) else [value]
    elif isinstance(value, list):
        raise ConfigFileError(f"{where} takes one value, not a list, as {option} is not repeatable.")
    else:
        values = [value]
    tokens = []
    for item in values:
        if isinstance(item, dict | list):
            raise ConfigFileError(f"{where} must hold strings or numbers, as {option} takes.")
        text = str(item).lower() if isinstance(item, bool) else str(item)
        tokens.append(f"{option}={text}")  # `=` keeps a value that starts with '-' a value
    return tokens


def _explicit_values(
    parser: argparse.ArgumentParser, tokens: list[str], *, raise_errors: bool = False
) -> dict[str, Any]:
    """dest -> value for each flag `tokens` give (not the defaults), parsed by `parser` itself.

    The namespace starts with every dest present, so argparse writes only what the tokens set
    (it fills a default only where a dest is missing). A repeatable flag starts at None, which
    its append turns into a fresh list.
    """
    namespace = argparse.Namespace()
    for action in parser._actions:
        if action.dest != argparse.SUPPRESS:
            setattr(namespace, action.dest, None if isinstance(action, argparse._AppendAction) else _UNSET)
    if raise_errors:

        def fail(message: str) -> None:
            raise _ParseError(message)

        parser.error = fail  # type: ignore[method-assign]
    try:
        parser.parse_args(tokens, namespace)
    finally:
        if raise_errors:
            del parser.error
    appends = {a.dest for a in parser._actions if isinstance(a, argparse._AppendAction)}
    return {
        dest: value
        for dest, value in vars(namespace).items()
        if value is not _UNSET and not (dest in appends and value is None)
    }
