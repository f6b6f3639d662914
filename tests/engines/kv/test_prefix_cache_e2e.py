"""A prefix-cache hit gives the same bits as a miss, as a client sees it: `dpgate engine` in its
served default over real gRPC, SmolLM2 and Gemma 3 (past its 512-token sliding window).

Every split point (a block boundary, one token either side, the whole prompt but one), the
uncached rest prefilled in chunks of a small token budget, beside noise streams, under
preemption of sequences that hold shared blocks, and under eviction; each warm request must
report cached tokens (no vacuous pass). A request asking for prompt logprobs scores every
position, cached prefix or not, and gets the same values.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import grpc

from dpgate.v1 import generate_pb2_grpc
from tests.engines.kv.prefix_exactness import (
    assert_same_bits,
    cold_and_warm,
    load,
    request,
    server_info,
    split_points,
)
from tests.engines.test_batch_invariance_e2e import counter
from tests.support.processes import free_port, running

BUDGET = ["--max-num-batched-tokens", "24"]


def tokens(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(count)]


def test_smollm2_hits_are_bit_identical_at_every_split_beside_noise(tmp_path):
    port = free_port()
    with running(["engine", "--port", str(port), *BUDGET], port, log_path=str(tmp_path / "engine.log")) as engine:
        info = server_info(engine.address)
        assert info.prefix_caching and info.prefix_cache_root_hash != 0
        base = tokens(1, 97)
        results = cold_and_warm(engine.address, base, split_points(len(base), info.kv_block_size), with_noise=True)
        assert load(engine.address).prefix_cache_hit_tokens > 0
        with grpc.insecure_channel(engine.address) as channel:  # prompt logprobs: every position scored
            stub = generate_pb2_grpc.InferenceServiceStub(channel)
            cold = stub.Generate(request(base, "pl-cold", prompt_logprobs=True), timeout=600)
            stub.Generate(request(base, "pl-warm", max_tokens=1), timeout=600)
            again = stub.Generate(request(base, "pl-warm", prompt_logprobs=True), timeout=600)
    assert_same_bits(results)
    assert again.finish.num_cached_prompt_tokens == 0 and len(again.prompt_logprobs) == len(base) - 1
    assert list(again.prompt_logprobs) == list(cold.prompt_logprobs)
    assert list(again.token_ids) == list(cold.token_ids) and list(again.logprobs) == list(cold.logprobs)


def test_gemma3_hits_are_bit_identical_past_the_sliding_window(tmp_path):
    port = free_port()
    args = ["engine", "--port", str(port), "--model", "gemma3-270m", "--max-model-len", "1024", *BUDGET]
    with running(args, port, timeout=300, log_path=str(tmp_path / "engine.log")) as engine:
        base = tokens(2, 700)  # more than the 512-token window of the sliding layers
        splits = split_points(len(base), server_info(engine.address).kv_block_size)
        results = cold_and_warm(engine.address, base, splits)
    assert_same_bits(results)


def test_shared_blocks_survive_preemption_and_eviction_with_the_same_bits(tmp_path):
    """24 blocks of 16 tokens: eight requests sharing a 64-token prefix, each 40 tokens more plus
    40 generated, cannot all run at once (preemption), and the distinct prompts before them push
    the cache past capacity (eviction)."""
    port, metrics_port = free_port(), free_port()
    args = ["engine", "--port", str(port), "--metrics-port", str(metrics_port), "--num-kv-blocks", "24", *BUDGET]
    prefix = tokens(3, 64)
    prompts = [prefix + tokens(10 + i, 40) for i in range(8)]
    with running(args, port, log_path=str(tmp_path / "engine.log")) as engine:
        with grpc.insecure_channel(engine.address) as channel:
            stub = generate_pb2_grpc.InferenceServiceStub(channel)
            cold = [stub.Generate(request(p, f"cold-{i}", max_tokens=40), timeout=600) for i, p in enumerate(prompts)]
            evicted_before = load(engine.address)
            stub.Generate(request([*prefix, 5], "warm", max_tokens=1), timeout=600)
            with ThreadPoolExecutor(8) as pool:
                warm = list(pool.map(lambda p: stub.Generate(request(p, "warm", max_tokens=40), timeout=600), prompts))
        after = load(engine.address)
        preemptions = counter(metrics_port, "dpgate_engine_preemptions_total")
        hits = counter(metrics_port, "dpgate_prefix_cache_hits_total")
    # The cold prompts alone registered 8 x 6 full blocks in a cache of 24: evictions happened.
    assert evicted_before.num_cached_blocks <= 24 and evicted_before.prefix_cache_query_tokens >= 8 * 104
    assert preemptions > 0 and hits == after.prefix_cache_hit_tokens > 0
    assert after.num_used_blocks == 0 and after.num_cached_free_blocks > 0
    assert all(w.finish.num_cached_prompt_tokens > 0 for w in warm)
    assert_same_bits([(i, c, w) for i, (c, w) in enumerate(zip(cold, warm, strict=True))])
