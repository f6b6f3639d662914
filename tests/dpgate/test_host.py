"""usable_cores counts the CPUs a process may run on, not the host's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dpgate.host import usable_cores
from tests.support.processes import pinned_to_one_cpu


def test_usable_cores_is_the_affinity_mask():
    assert usable_cores() == len(os.sched_getaffinity(0))


@pytest.mark.e2e
def test_a_process_pinned_to_one_cpu_has_one_usable_core():
    child = subprocess.run(
        [sys.executable, "-c", "from dpgate.host import usable_cores; print(usable_cores())"],
        capture_output=True, text=True, timeout=30, preexec_fn=pinned_to_one_cpu,
    )  # fmt: skip
    assert child.stdout.strip() == "1", child.stderr
