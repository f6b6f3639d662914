"""The gateway hashes a Generate prompt exactly as the engine does: for a 50-request corpus of text
prompts (prose, code, numbers, non-ASCII, special-token markup, leading spaces), with salts and
tenants, every block hash the gateway computes from the engine's own tokenizer (GetTokenizer, run by
the `tokenizers` library) and the documented function is in the engine's cached set after the
request, and the prompt's token count equals the engine's. On both packaged models."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from dpgate.tenant import TENANT_KEY
from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from gateway.prompt_tokenizers import PromptTokenizers
from gateway.routing.block_hashes import block_chain
from tests.support.processes import free_port, running

_WORDS_TEXT = (
    "the cache routes prompts engines gateway token block hash salt tenant model answer question "
    "Paris Zürich naïve café 東京 データ 🙂 def return {} [] () 12345 3.14159 -- ### <|im_start|> <|im_end|> "
    "\n \t  indent    spaces"
)
WORDS = _WORDS_TEXT.split(" ")


def corpus(seed: int) -> list[tuple[str, str, str]]:
    """50 (text, salt, tenant) triples; some share a long prefix so later requests hit the cache."""
    rng = random.Random(seed)
    shared = " ".join(rng.choice(WORDS) for _ in range(120))
    items = []
    for i in range(50):
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(10, 250)))
        text = (shared + body) if i % 2 else (" " * (i % 3) + body)
        items.append((text, f"salt-{i % 4}" if i % 3 else "", "tenant-a" if i % 5 == 0 else ""))
    return items


def learn_tokenizer(address: str) -> tuple[PromptTokenizers, str]:
    options = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]
    with grpc.insecure_channel(address, options=options) as channel:
        stub = control_pb2_grpc.ControlServiceStub(channel)
        info = stub.GetServerInfo(cpb.GetServerInfoRequest(), timeout=30)
        answer = stub.GetTokenizer(cpb.GetTokenizerRequest(), timeout=60)
    assert info.tokenizer_fingerprint == answer.fingerprint and len(answer.fingerprint) == 64
    tokenizers = PromptTokenizers()

    async def fetch():
        return answer

    assert asyncio.run(tokenizers.learn(answer.fingerprint, fetch))
    return tokenizers, answer.fingerprint


def cached_set(stub: control_pb2_grpc.ControlServiceStub) -> set[int]:
    call = stub.WatchKvEvents(cpb.WatchKvEventsRequest())
    first = next(iter(call))
    call.cancel()
    return {block.block_hash for block in first.snapshot.blocks}


@pytest.mark.parametrize(
    "model_args",
    [pytest.param([], id="smollm2"), pytest.param(["--model", "gemma3-270m", "--max-model-len", "2048"], id="gemma3")],
)
def test_gateway_block_hashes_equal_the_engines_for_every_block(tmp_path, model_args):
    port = free_port()
    args = ["engine", "--port", str(port), *model_args]
    with running(args, port, timeout=300, log_path=str(tmp_path / "engine.log")) as engine:
        tokenizers, fingerprint = learn_tokenizer(engine.address)
        with grpc.insecure_channel(engine.address) as channel:
            control = control_pb2_grpc.ControlServiceStub(channel)
            info = control.GetServerInfo(cpb.GetServerInfoRequest(), timeout=30)
            inference = generate_pb2_grpc.InferenceServiceStub(channel)
            num_blocks = num_hit_requests = 0
            for text, salt, tenant in corpus(11):
                ids = tokenizers.encode(fingerprint, text).ids
                chain = block_chain(ids, info.prefix_cache_root_hash, info.kv_block_size, tenant, salt)
                predicted_hit = len(chain) and chain[0] in cached_set(control)
                stopping = pb.StoppingCriteria(max_tokens=1, ignore_eos=True)
                metadata = ((TENANT_KEY, tenant),) if tenant else ()
                request = pb.GenerateRequest(text=text, stopping=stopping, cache_salt=salt)
                reply = inference.Generate(request, metadata=metadata, timeout=600)
                assert reply.finish.num_prompt_tokens == len(ids), text
                cached = cached_set(control)
                assert [h for h in chain if h not in cached] == [], f"gateway hashes missing from the engine: {text!r}"
                num_blocks += len(chain)
                num_hit_requests += reply.finish.num_cached_prompt_tokens > 0
                assert (reply.finish.num_cached_prompt_tokens > 0) == bool(predicted_hit)
    assert num_blocks > 200 and num_hit_requests > 10
