"""The metric names a PromQL expression reads, for checking dashboards against live /metrics.

Not a full PromQL parser, and on purpose one that errs towards calling a word a metric: it drops
string literals, label matchers (`{...}`) and range selectors (`[...]`), then every identifier
that is not a function or aggregation (followed by `(`), a keyword, or a label in a `by`,
`without`, `on`, `ignoring`, `group_left` or `group_right` list is a metric name. A word it
mistakes for a metric fails the dashboard test loudly; it never hides a missing metric.
"""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACED = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
# An identifier not glued to a number or a dot (so the `m` of `5m` or the `e` of `1e3` is not one).
_IDENTIFIER = re.compile(r"(?<![\w.])[A-Za-z_:][\w:]*")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk"}
    | {"quantile", "limitk", "limit_ratio", "inf", "nan", "atan2", "start", "end"}
)


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects (see the module docstring for how)."""
    text = _STRING.sub(" ", expr)
    previous = None
    while previous != text:  # matchers hold no brackets once strings are gone; ranges may nest in subqueries
        previous, text = text, _BRACED.sub(" ", text)
    text = _LABEL_LIST.sub(r"\1 ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        rest = text[match.end() :].lstrip()
        if word.lower() in _KEYWORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


# A histogram family `f` is read as f_bucket, f_sum and f_count; a counter `f` as f_total.
SAMPLE_SUFFIXES = {
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "counter": ("_total", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "untyped": ("",),
}


def exposed_names(exposition: str) -> set[str]:
    """Every sample name a Prometheus text exposition can be queried by: the samples it holds, and
    the names its `# TYPE` lines promise (a labelled family shows no sample until first used)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            names.update(family + suffix for suffix in SAMPLE_SUFFIXES.get(kind, ("",)))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names
