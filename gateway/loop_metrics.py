"""Counters and histograms that only the gateway's event loop updates: the per-call series.

prometheus_client's metrics take a lock on every update so that any thread may update them, and
its histogram walks its buckets in Python: a relayed unary call updates five series, which cost
3.4 us a call, 3% of the gateway's CPU (issue 27). The series here are updated from the loop's
thread alone, so they need no lock: an update is a few attribute stores. The exposition thread
reads them at a scrape (prometheus_client's `start_http_server` thread, or `generate_latest` on
the loop): it copies the children first (a C-level copy the loop cannot interleave with, under
the GIL) and may see one call's update half done across a histogram's count and sum, as a scrape
of prometheus_client's own histogram (a lock per value, not one for all) may too.

What a scrape shows is what prometheus_client shows for its Counter and Histogram: `_total` and
`_created` for a counter, cumulative `_bucket`s with `le` formatted as Go does, `_count`, `_sum`
and `_created` for a histogram; `PROMETHEUS_DISABLE_CREATED_SERIES` leaves the `_created` out.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

_CREATED = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in ("true", "1")


class CounterValue:
    """One labelled counter's value."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class HistogramValue:
    """One labelled histogram's observations: a count per bucket (not cumulative) and their sum."""

    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # The first bucket whose upper bound is at least `amount` (a bucket counts values <= le).
        self.counts[bisect_left(self._bounds, amount)] += 1
        self.sum += amount


class _LoopFamily:
    """What both kinds share: the name, the label names, registration."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        registry.register(self)

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes the labels {', '.join(self.labelnames)}, not {', '.join(labels)}")
        return tuple(str(labels[name]) for name in self.labelnames)

    def _family(self) -> Metric:
        raise NotImplementedError

    def describe(self) -> list[Metric]:
        """The family without samples: the registry learns the names it exposes (duplicates are
        refused, and a scrape restricted by `name[]` finds it) without a collect."""
        return [self._family()]


class LoopCounter(_LoopFamily):
    """A counter family updated from one thread; `labels(...)` gives the child to keep and `inc`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self._children: dict[tuple[str, ...], CounterValue] = {}
        super().__init__(name, documentation, labelnames, registry)

    def labels(self, **labels: str) -> CounterValue:
        key = self._key(labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = CounterValue()
        return child

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for key, child in list(self._children.items()):
            family.add_metric(key, child.value, created=child.created if _CREATED else None)
        yield family


class LoopHistogram(_LoopFamily):
    """A histogram family updated from one thread; with no label names it is its own only child
    (`observe` directly), as prometheus_client's unlabelled Histogram is."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = tuple(float(bound) for bound in buckets if bound != float("inf"))
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"{name}: bucket bounds must increase")
        self._bounds = bounds
        self._les = [floatToGoString(bound) for bound in bounds] + ["+Inf"]
        self._children: dict[tuple[str, ...], HistogramValue] = {}
        super().__init__(name, documentation, labelnames, registry)
        self._only = self.labels() if not self.labelnames else None

    def labels(self, **labels: str) -> HistogramValue:
        key = self._key(labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = HistogramValue(self._bounds)
        return child

    def observe(self, amount: float) -> None:
        if self._only is None:
            raise ValueError(f"{self.name} has labels: observe through labels(...)")
        self._only.observe(amount)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for key, child in list(self._children.items()):
            counts, total = list(child.counts), child.sum
            cumulative = 0
            buckets = []
            for le, count in zip(self._les, counts, strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            family.add_metric(key, buckets, total)
            if _CREATED:
                family.samples.append(
                    Sample(self.name + "_created", dict(zip(self.labelnames, key, strict=True)), child.created)
                )
        yield family
