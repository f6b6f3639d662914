"""gateway/gc_settings.py: after start-up the collector no longer walks what start-up made, and young
collections come a tenth as often; cycles are still collected."""

from __future__ import annotations

import gc
import weakref

from gateway.gc_settings import OLDER_THRESHOLDS, YOUNG_THRESHOLD, settle_after_start


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_settling_freezes_start_up_and_still_collects_cycles():
    saved = gc.get_threshold()
    try:
        settle_after_start()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
        assert gc.get_freeze_count() > 0  # this interpreter's modules are out of the collector's sight
        first, second = Node(), Node()
        first.other, second.other = second, first  # a cycle made after start-up
        alive = weakref.ref(first)
        del first, second
        assert alive() is not None  # reference counting alone cannot free it
        gc.collect(0)
        assert alive() is None  # the young collection still does
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
