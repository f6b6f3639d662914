"""Prompts an engine announces as queued draw their prefix's later calls to it, through a gateway
that never saw them (as if another gateway replica, or a client talking to the engine, sent them).

Rank 0 runs one sequence at a time: a long answer holds it while a prompt sent straight to the
engine waits in its queue, announced but not computed. The same prompt sent through the gateway
then goes to rank 0, although rank 1 is idle and the gateway's index holds none of it, and is
served from the cache (it waits for the first one's prefill, then hits)."""

from __future__ import annotations

import time

import grpc

from dpgate.v1 import generate_pb2 as pb
from tests.support.gateway_processes import FAST_HEALTH, EngineProcess, GatewayProcess, all_serving, inference_stub

PROMPT = "A long shared system prompt that one client queued straight at the engine. " * 10


def pending_on(gateway: GatewayProcess, rank: int) -> float:
    return sum(
        value
        for name, value in gateway.metrics().items()
        if name.startswith("dpgate_gateway_kv_pending_prompts{") and f'rank="{rank}"' in name
    )


def test_a_prompt_queued_at_an_engine_draws_the_same_prefix_there(tiny_model_dir, engines, log_dir):
    one_at_a_time = EngineProcess(tiny_model_dir, 0, 2, log_dir, "--max-num-seqs", "1", name="one-seq-engine")
    with all_serving([one_at_a_time]):
        gateway = GatewayProcess(
            [one_at_a_time.address, engines[1].address], *FAST_HEALTH, log_dir=log_dir, name="announce-gateway"
        )
        try:
            gateway.wait_ranks([0, 1])
            with grpc.insecure_channel(gateway.address) as via_gateway, grpc.insecure_channel(
                one_at_a_time.address
            ) as direct:
                routed, straight = inference_stub(via_gateway), inference_stub(direct)
                deadline = time.monotonic() + 60  # until the gateway hashes prompts (tokenizer learned)
                while not any(
                    name.startswith("dpgate_gateway_hashed_prompt_tokens_total") and value > 0
                    for name, value in gateway.metrics().items()
                ):
                    assert time.monotonic() < deadline, "the gateway never hashed a prompt"
                    stopping = pb.StoppingCriteria(max_tokens=1)
                    routed.Generate(pb.GenerateRequest(text="warming up " * 8, stopping=stopping), timeout=60)
                    time.sleep(0.2)
                holder = straight.GenerateStream(
                    pb.GenerateStreamRequest(
                        token_ids=pb.TokenIds(ids=[5, 6, 7]),
                        stopping=pb.StoppingCriteria(max_tokens=900, ignore_eos=True),
                    ),
                    timeout=120,
                )
                next(holder)  # it runs: rank 0's only sequence slot is taken
                stopping = pb.StoppingCriteria(max_tokens=2, ignore_eos=True)
                queued = straight.Generate.future(
                    pb.GenerateRequest(text=PROMPT, stopping=stopping, cache_salt="announced"), timeout=120
                )
                deadline = time.monotonic() + 30
                while pending_on(gateway, 0) < 1:  # the announcement reached the gateway's index
                    assert time.monotonic() < deadline, "rank 0 never announced the queued prompt"
                    time.sleep(0.05)
                time.sleep(0.6)  # two health intervals: the gateway's view of rank 0's load is current
                later = routed.Generate.future(
                    pb.GenerateRequest(text=PROMPT, stopping=stopping, cache_salt="announced"), timeout=120
                )
                time.sleep(0.5)  # routed by now; then free rank 0's slot
                holder.cancel()
                reply, call = later.result(), later
                assert queued.result().finish.num_prompt_tokens == reply.finish.num_prompt_tokens
        finally:
            gateway.stop()
    assert int(dict(call.trailing_metadata())["x-data-parallel-rank"]) == 0
    assert reply.finish.num_cached_prompt_tokens > 0  # it waited for the queued one's prefill and hit
    assert holder.code() == grpc.StatusCode.CANCELLED  # still running when the later call was routed
