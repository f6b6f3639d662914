"""The lock-free per-call series (gateway/loop_metrics.py) expose exactly what prometheus_client's
Counter and Histogram expose for the same updates: dashboards, alerts and promtool see no change."""

from __future__ import annotations

import random
import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.loop_metrics import LoopCounter, LoopHistogram

BUCKETS = (0.00005, 0.0001, 0.001, 0.0025, 0.01, 0.1, 1, 2.5, 30, float("inf"))
CREATED = re.compile(rb"^(\S+_created)(\{[^}]*\})? \S+$", re.MULTILINE)


def exposition(registry: CollectorRegistry) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The text without the `_created` values (times of creation differ), and which `_created` series there are."""
    text = generate_latest(registry)
    created = [(match[1], match[2] or b"") for match in CREATED.finditer(text)]
    return CREATED.sub(rb"\1\2 T", text), created


def test_the_same_updates_expose_the_same_text_as_prometheus_client():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    families = [
        (LoopCounter("calls", "Calls.", ["rpc", "code"], registry=ours),
         Counter("calls", "Calls.", ["rpc", "code"], registry=theirs)),
        (LoopHistogram("seconds", "Time.", ["rpc"], buckets=BUCKETS, registry=ours),
         Histogram("seconds", "Time.", ["rpc"], buckets=BUCKETS, registry=theirs)),
    ]  # fmt: skip
    plain_ours = LoopHistogram("plain_seconds", "Unlabelled.", [], buckets=BUCKETS[:-1], registry=ours)
    plain_theirs = Histogram("plain_seconds", "Unlabelled.", buckets=BUCKETS[:-1], registry=theirs)
    rng = random.Random(27)
    for _ in range(2000):
        rpc, code = rng.choice(["Generate", "GenerateStream", "Abort"]), rng.choice(["OK", "CANCELLED"])
        amount = rng.choice([rng.random() * 10, rng.random() / 1000, *BUCKETS[:-1], 0.0, 100.0])
        (counter, their_counter), (histogram, their_histogram) = families
        counter.labels(rpc=rpc, code=code).inc(amount)
        their_counter.labels(rpc=rpc, code=code).inc(amount)
        histogram.labels(rpc=rpc).observe(amount)
        their_histogram.labels(rpc=rpc).observe(amount)
        plain_ours.observe(amount)
        plain_theirs.observe(amount)
    text, created = exposition(ours)
    their_text, their_created = exposition(theirs)
    assert text == their_text
    assert created == their_created and len(created) == 6 + 3 + 1


def test_refusals_name_the_rule():
    registry = CollectorRegistry()
    counter = LoopCounter("calls", "Calls.", ["rpc"], registry=registry)
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels(rpc="Generate").inc(-1)
    with pytest.raises(ValueError, match="takes the labels rpc"):
        counter.labels(code="OK")
    with pytest.raises(ValueError, match="has labels"):
        LoopHistogram("seconds", "Time.", ["rpc"], buckets=BUCKETS, registry=registry).observe(1.0)
    with pytest.raises(ValueError, match="must increase"):
        LoopHistogram("other_seconds", "Time.", [], buckets=(1, 0.5), registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):  # the registry knows the names (describe)
        Counter("calls", "Calls again.", registry=registry)
