"""The gateway hashes a Chat prompt exactly as the engine does: for a 50-request Chat corpus
(tests/gateway/chat_corpus.py: multi-turn conversations sharing prefixes, system prompts, tools
and past tool calls, reasoning, thinking switches, salts, non-ASCII), every block hash the gateway
computes by rendering the messages with what GetTokenizer handed it (dpgate/chat/) is in the
engine's cached set after the request, and the prompt's token count equals the engine's. On both
packaged models: SmolLM2 with its own template (tools in a Hermes block), Gemma 3 with a template
that reads tools, thinking and `bos_token` itself (its GGUF has none: `--chat-template FILE`)."""

from __future__ import annotations

import grpc
import pytest

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from gateway.routing.block_hashes import block_chain
from tests.gateway.chat_corpus import chat_corpus
from tests.gateway.test_prompt_hashes_e2e import cached_set, learn_tokenizer
from tests.support.chat_templates import GEMMA_STYLE_TEMPLATE
from tests.support.processes import free_port, running


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_gateway_chat_block_hashes_equal_the_engines_for_every_block(tmp_path, model):
    port = free_port()
    args = ["engine", "--port", str(port)]
    if model == "gemma3":
        template = tmp_path / "gemma.jinja"
        template.write_text(GEMMA_STYLE_TEMPLATE)
        args += ["--model", "gemma3-270m", "--max-model-len", "2048", "--chat-template", str(template)]
    with running(args, port, timeout=300, log_path=str(tmp_path / "engine.log")) as engine:
        tokenizers, fingerprint = learn_tokenizer(engine.address)
        assert tokenizers.renders_chat(fingerprint)
        template = tokenizers.chat_templates[fingerprint]
        assert template.handles_tools is (model == "gemma3")
        assert template.special_tokens["bos_token"] == ("<bos>" if model == "gemma3" else "<|im_start|>")
        with grpc.insecure_channel(engine.address) as channel:
            control = control_pb2_grpc.ControlServiceStub(channel)
            info = control.GetServerInfo(cpb.GetServerInfoRequest(), timeout=30)
            inference = generate_pb2_grpc.InferenceServiceStub(channel)
            num_blocks = num_hit_requests = 0
            for request in chat_corpus(7):
                ids = tokenizers.encode_chat(fingerprint, request).ids
                chain = block_chain(ids, info.prefix_cache_root_hash, info.kv_block_size, "", request.cache_salt)
                predicted = 0
                cached = cached_set(control)
                for block_hash in chain:  # the engine takes the leading blocks it holds
                    if block_hash not in cached:
                        break
                    predicted += info.kv_block_size
                reply = inference.Chat(request, timeout=600)
                assert reply.finish.num_prompt_tokens == len(ids), request
                cached = cached_set(control)
                assert [h for h in chain if h not in cached] == [], f"gateway hashes missing from the engine: {request}"
                assert reply.finish.num_cached_prompt_tokens == predicted
                num_blocks += len(chain)
                num_hit_requests += predicted > 0
    assert num_blocks > 200 and num_hit_requests >= 30
