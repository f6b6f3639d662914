"""bench/routing_capacity.py: the capacity the routing bench derives its arrival rate from."""

from __future__ import annotations

from argparse import Namespace

import pytest
from routing_capacity import Capacity, measure_capacity

from tests.support.gateway_processes import SyntheticEngineProcess, all_serving


def test_the_workloads_capacity_mixes_first_calls_and_cached_calls_by_their_time():
    # One first call in four at 1 call/s, three cached calls at 3 calls/s: 4 calls take 1 + 1 = 2 s.
    assert Capacity(misses_per_s=1.0, hits_per_s=3.0, first_call_share=0.25).calls_per_s == pytest.approx(2.0)
    # Every call a first call: the rate of whole prompts.
    assert Capacity(misses_per_s=0.5, hits_per_s=9.0, first_call_share=1.0).calls_per_s == pytest.approx(0.5)


@pytest.mark.e2e
def test_both_loops_keep_every_engine_busy_with_its_own_calls(tmp_path):
    # Synthetic engines: 2 ms a token, 4 tokens a call, so a call takes about 8 ms wherever it goes.
    engines = [SyntheticEngineProcess(rank, 2, tmp_path, "--token-delay", "0.002") for rank in range(2)]
    args = Namespace(prefix_tokens=32, question_tokens=8, answer_tokens=4, max_num_seqs=3, prompts_per_group=4)
    with all_serving(engines):
        capacity = measure_capacity([engine.address for engine in engines], args)
        served = [engine.requests_total().get("Generate", 0) for engine in engines]
    # Each engine: 3 workers x 2 calls whole, its prefix once, 3 workers x 2 calls cached.
    assert served == [13, 13]
    assert capacity.misses_per_s > 0 and capacity.hits_per_s > 0
    assert capacity.first_call_share == 0.25
    # 12 calls at a time, 8 ms each: far below 12 / 0.008 = 1,500 calls/s, far above 1 call/s.
    assert 1 < capacity.calls_per_s < 1500
