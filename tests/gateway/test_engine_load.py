"""An engine's load as routing reads it: GetLoad's figures (up to one health interval old) less the
calls this gateway saw end since they were asked, plus the prefill of calls still open.

The figures must age: a CI run sent four sequential unpinned calls after a call pinned to rank 1,
and all four went to rank 0, because rank 1's last GetLoad had caught the pinned call running
(1 request, a block of KV) and nothing took it out until the next poll a second later.
"""

from __future__ import annotations

import asyncio
import time

from dpgate.v1 import control_pb2
from gateway.config import GatewayConfig, validate_config
from gateway.engine_pool import EnginePool
from gateway.handshake import EngineIdentity
from gateway.metrics import GatewayMetrics
from gateway.reported_load import ReportedLoad
from gateway.routing import RouteRequest, make_policy
from gateway.routing.filters import PromptBlocks


def reported(num_running=0, num_waiting=0, num_used_blocks=0) -> ReportedLoad:
    """A ReportedLoad that has taken one GetLoad answer (calls dispatched at 0 were in it)."""
    load = ReportedLoad()
    ask, before = load.asking()
    answer = control_pb2.GetLoadResponse(
        num_running=num_running, num_waiting=num_waiting, num_used_blocks=num_used_blocks
    )
    load.answered(ask, before, answer)
    return load


def test_the_only_call_ending_leaves_nothing_held():
    load = reported(num_running=1, num_used_blocks=3)  # a 40-token prompt and its answer in 3 blocks
    assert load.kv_tokens(16) == 48 and load.running_and_waiting() == (1, 0)
    load.released(dispatched_at=0, num_prompt_tokens=40)
    assert load.kv_tokens(16) == 0, "the rounding and the answer's tokens went with the call"
    assert load.running_and_waiting() == (0, 0)


def test_kv_shrinks_by_the_prompt_or_by_the_share_of_requests_whichever_is_more():
    load = reported(num_running=4, num_used_blocks=100)  # 1,600 tokens
    load.released(0, 100)
    assert load.kv_tokens(16) == min(1600 - 100, 1600 * 3 // 4) == 1200
    load.released(0, 1000)
    assert load.kv_tokens(16) == min(1600 - 1100, 1600 * 2 // 4) == 500
    load.released(0, 0)  # a call the gateway did not tokenize (pinned, Chat without index)
    assert load.kv_tokens(16) == 400 and load.num_requests == 1


def test_the_ended_calls_were_running_and_waiting_requests_take_their_places():
    load = reported(num_running=2, num_waiting=3, num_used_blocks=10)
    load.released(0)
    assert load.running_and_waiting() == (2, 2)
    for _ in range(3):
        load.released(0)
    assert load.running_and_waiting() == (1, 0)
    for _ in range(5):
        load.released(0)
    assert load.running_and_waiting() == (0, 0) and load.kv_tokens(16) == 0


def test_a_call_sent_after_the_figure_was_asked_was_never_in_it():
    load = reported(num_running=1, num_used_blocks=4)
    load.released(dispatched_at=load.num_asks, num_prompt_tokens=30)  # started and ended since the poll
    assert load.kv_tokens(16) == 64 and load.num_requests == 1


def test_releases_before_the_ask_are_in_the_answer_and_those_after_stay_counted():
    load = reported(num_running=3, num_used_blocks=30)
    load.released(0, 100)  # ended before the next ask: that answer no longer counts it
    ask, before = load.asking()
    load.released(0, 20)  # ended while the ask was on its way: maybe still in the answer
    load.answered(ask, before, control_pb2.GetLoadResponse(num_running=2, num_used_blocks=20))
    assert load.num_requests == 1
    assert load.kv_tokens(16) == min(320 - 20, 320 * 1 // 2) == 160


def test_an_answer_older_than_the_figures_is_dropped():
    load = ReportedLoad()
    first, before_first = load.asking()
    second, before_second = load.asking()
    load.answered(second, before_second, control_pb2.GetLoadResponse(num_running=1))
    load.answered(first, before_first, control_pb2.GetLoadResponse(num_running=7))
    assert load.num_requests == 1


def with_two_engines(check) -> None:
    async def main() -> None:
        config = validate_config(GatewayConfig(engines=("127.0.0.1:1", "127.0.0.1:2")))
        pool = EnginePool(config, GatewayMetrics())
        for rank, engine in enumerate(pool.engines):
            engine.accept(EngineIdentity(engine.address, rank, 2, "m", kv_block_size=16))
        try:
            await check(pool.engines)
        finally:
            await pool.close()

    asyncio.run(main())


def test_sequential_calls_alternate_after_a_call_the_last_poll_caught_running():
    async def check(engines):
        busy = engines[1]
        busy.num_in_flight += 1
        dispatched_at = busy.reported.num_asks

        async def get_load(request, timeout):
            return control_pb2.GetLoadResponse(num_running=1, num_used_blocks=1)

        busy._get_load = get_load
        await busy.refresh_load(timeout=1.0)  # the poll sees the call running
        stale = [engine.view(time.monotonic()) for engine in engines]
        assert make_policy("least-loaded").select(stale) == 0 and stale[1].load_tokens == 16
        busy.num_in_flight -= 1
        busy.reported.released(dispatched_at)  # the call ends before the next poll
        views = [engine.view(time.monotonic()) for engine in engines]
        assert views[0].load == views[1].load == 0 and views[0].load_tokens == views[1].load_tokens == 0
        prompt = RouteRequest(prompt=PromptBlocks(num_prompt_tokens=5))  # shorter than a block: no match
        for name, request in (("least-loaded", None), ("cache-aware", None), ("cache-aware", prompt)):
            policy = make_policy(name)
            assert {policy.select(views, request) for _ in range(4)} == {0, 1}, name

    with_two_engines(check)
