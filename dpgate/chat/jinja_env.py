"""The Jinja environment chat templates run in, and rendering one.

A chat template is untrusted code from a model's files, so it runs sandboxed and immutable
(`ImmutableSandboxedEnvironment`: no attribute escapes, no mutation of what it is given). The rest
is the environment chat templates are written for (Hugging Face's documented conventions, which
transformers' `apply_chat_template` provides): `trim_blocks` and `lstrip_blocks`, `break` and
`continue`, a `tojson` that does not escape HTML and keeps non-ASCII, `raise_exception(message)`,
`strftime_now(format)`, a `dict` callable, a `namespace` that refuses underscore names, and the
`{% generation %}` block (which marks assistant text for training masks; a prompt writes its body
unchanged). A message's `reasoning_content` is also visible as `thinking` (gpt-oss templates read
that name). tests/engines/chat/test_template.py checks the output equals transformers' on the
packaged models' templates and on templates written to exercise each of these.

Both the engine (the prompt it runs) and the gateway (the prompt it hashes) render through here,
so they cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %} ... {% endgeneration %}`: rendered as its body, in a scope of its own."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's Extension declares it as a plain class attribute)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's `namespace()`, refusing names that start with an underscore (a way to CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        values = dict(*rest, **kwargs)
        for name in values:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, values)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a chat template cannot set the namespace attribute {name!r}")


class _DictMaker:
    """`dict(...)` and `dict.fromkeys(...)` inside a template, without handing it the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict:
        return dict.fromkeys(*args)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = _DictMaker()
    environment.globals["namespace"] = _Namespace
    return environment


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template (cached: a deployment renders with one or two sources). Raises
    jinja2.TemplateSyntaxError for a template that does not parse."""
    return _environment().from_string(source)


def render_template(
    source: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    variables: Mapping[str, Any],
    add_generation_prompt: bool = True,
) -> str:
    """The template's text for a conversation. `variables` are the template's other inputs (the
    special tokens, then the request's chat_template_kwargs over them). Raises jinja2.TemplateError
    (the template's own `raise_exception` among them), TypeError, ValueError or KeyError when the
    template fails on this input."""
    return compile_template(source).render(
        messages=[_with_reasoning_alias(message) for message in messages],
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )


def _with_reasoning_alias(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        return message
    aliased = {"thinking": reasoning}
    aliased.update(message)
    return aliased
