"""Prefix-cache tenants through the gateway: `dpgate serve` with two API keys and a tiny model.

Isolated (the default): key B never gets a cached token for key A's prompt, in usage and in the
engine's hit counter, not even by sending A's tenant header itself or the same cache_salt; key A
gets its own hits. Shared: key B hits what key A cached.
"""

from __future__ import annotations

import random

import grpc
import pytest

from dpgate.tenant import TENANT_KEY
from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from gateway.tenant import tenant_for_key
from tests.engines.test_batch_invariance_e2e import counter
from tests.support.processes import free_port, running
from tests.tiny_model import make_tiny_llama_dir

PROMPT = [random.Random(8).randrange(100, 40000) for _ in range(70)]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_llama_dir(tmp_path_factory.mktemp("tiny-tenants"), seed=2)


def cached_tokens(stub, key: str, salt: str = "", extra_metadata: tuple = ()) -> int:
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=PROMPT), stopping=pb.StoppingCriteria(max_tokens=2, ignore_eos=True), cache_salt=salt
    )
    reply = stub.Generate(request, metadata=(("authorization", f"Bearer {key}"), *extra_metadata), timeout=60)
    return reply.finish.num_cached_prompt_tokens


def serve(tiny_model, tmp_path, *flags):
    port, metrics_port = free_port(), free_port()
    args = ["serve", "--port", str(port), "--model", str(tiny_model), "--engine-metrics-port", str(metrics_port),
            "--api-key", "key-a", "--api-key", "key-b", *flags]  # fmt: skip
    return running(args, port, timeout=180, log_path=str(tmp_path / "serve.log")), metrics_port


def test_isolated_keys_never_share_a_cached_prompt(tiny_model, tmp_path):
    process, metrics_port = serve(tiny_model, tmp_path)
    with process as gateway, grpc.insecure_channel(gateway.address) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        assert cached_tokens(stub, "key-a") == 0
        assert cached_tokens(stub, "key-a") == 64  # its own prompt again: four full blocks of 16
        hits = counter(metrics_port, "dpgate_prefix_cache_hits_total")
        forged = ((TENANT_KEY, tenant_for_key("key-a")),)  # a client's own tenant header is never forwarded
        assert cached_tokens(stub, "key-b", extra_metadata=forged) == 0
        assert cached_tokens(stub, "key-b") == 64  # its own prompt, cached by its call above
        assert counter(metrics_port, "dpgate_prefix_cache_hits_total") == hits + 64
        assert cached_tokens(stub, "key-a", salt="s") == 0  # the salt is combined with the key, not instead
        assert cached_tokens(stub, "key-b", salt="s") == 0
        assert cached_tokens(stub, "key-b", salt="s") == 64


def test_shared_keys_share_cached_prompts(tiny_model, tmp_path):
    process, _ = serve(tiny_model, tmp_path, "--prefix-cache-sharing", "shared")
    with process as gateway, grpc.insecure_channel(gateway.address) as channel:
        stub = generate_pb2_grpc.InferenceServiceStub(channel)
        assert cached_tokens(stub, "key-a") == 0
        assert cached_tokens(stub, "key-b") == 64
        control = control_pb2_grpc.ControlServiceStub(channel)
        metadata = (("authorization", "Bearer key-a"), ("x-data-parallel-rank", "0"))
        reply = control.ResetPrefixCache(cpb.ResetPrefixCacheRequest(), metadata=metadata, timeout=30)
        assert reply.num_cleared_blocks >= 4
        assert cached_tokens(stub, "key-b") == 0  # forgotten
        assert control.GetLoad(cpb.GetLoadRequest(), metadata=metadata, timeout=30).num_cached_blocks >= 4
