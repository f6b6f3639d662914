"""The HTTP/2 layer fuzzed: atheris drives 100,000+ inputs through it in CI, each a fresh connection.

See tests/gateway/http2/fuzz_target.py for what an input is and what `check` holds the connection to.
The atheris run is coverage-guided and seeded, so CI repeats the same inputs; it starts from
`seed_inputs()` and prints its input count and time. The in-process tests replay the seeds and
a fixed set of random inputs for quick feedback without atheris.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import time

import pytest

from tests.gateway.http2 import fuzz_target as http2_fuzz
from tests.support.gateway_processes import PYTHON, ROOT

NUM_RUNS = 110_000
RSS_GROWTH_ALLOWED_MB = 2048


def _rss_limit_mb() -> int:
    """libFuzzer's memory limit for a run started from this process.

    libFuzzer judges memory by the peak resident size (getrusage's ru_maxrss), and Linux carries
    the parent's high-water mark across fork and exec: under a suite that has loaded models, the
    child starts out "using" gigabytes it never touched. The limit is therefore this process's own
    high-water mark plus the growth a fuzz run may really cause.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024 + RSS_GROWTH_ALLOWED_MB
    return RSS_GROWTH_ALLOWED_MB


def test_the_seeds_pass():
    for data in http2_fuzz.seed_inputs():
        http2_fuzz.run_input(data)


def test_random_inputs_pass():
    rng = random.Random(20231010)  # the day CVE-2023-44487 was published
    for _ in range(3000):
        http2_fuzz.run_input(rng.randbytes(rng.randint(0, 400)))


@pytest.mark.e2e
def test_atheris_finds_nothing_in_100_000_inputs(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for index, data in enumerate(http2_fuzz.seed_inputs()):
        (corpus / f"seed-{index}").write_bytes(data)
    started = time.monotonic()
    result = subprocess.run(
        [PYTHON, "-m", "tests.gateway.http2.fuzz_main", f"-runs={NUM_RUNS}", "-seed=1", "-max_len=4096",
         "-timeout=10", f"-rss_limit_mb={_rss_limit_mb()}", f"-artifact_prefix={tmp_path}/", str(corpus)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-6000:]
    done = re.search(r"Done (\d+) runs", result.stderr)
    assert done is not None, result.stderr[-2000:]
    assert int(done.group(1)) >= 100_000
    print(f"atheris: {done.group(1)} inputs in {elapsed:.1f} s")
