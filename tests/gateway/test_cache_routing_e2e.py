"""Cache-aware routing through a real `dpgate gateway` (its default policy) in front of two engines:
a prompt sent again lands on the engine that cached it and is served from that cache, the
gateway's predicted cached tokens equal what the engine reports (FinishInfo), the reasons are
counted, and distinct cold prompts spread over both engines."""

from __future__ import annotations

import time

import grpc

from dpgate.v1 import generate_pb2 as pb
from tests.support.gateway_processes import FAST_HEALTH, EngineProcess, GatewayProcess, inference_stub


def served_rank(call) -> int:
    return int(dict(call.trailing_metadata())["x-data-parallel-rank"])


def generate(stub, text: str, salt: str = "") -> tuple[pb.GenerateResponse, int]:
    stopping = pb.StoppingCriteria(max_tokens=2, ignore_eos=True)
    reply, call = stub.Generate.with_call(pb.GenerateRequest(text=text, stopping=stopping, cache_salt=salt), timeout=60)
    return reply, served_rank(call)


def metric(gateway: GatewayProcess, prefix: str) -> float:
    return sum(value for name, value in gateway.metrics().items() if name.startswith(prefix))


def test_repeated_prompts_follow_their_cache_and_predictions_match_the_engine(engines: list[EngineProcess], log_dir):
    gateway = GatewayProcess([e.address for e in engines], *FAST_HEALTH, log_dir=log_dir, name="cache-gateway")
    try:
        gateway.wait_ranks([0, 1])
        with grpc.insecure_channel(gateway.address) as channel:
            stub = inference_stub(channel)
            deadline = time.monotonic() + 60  # until the gateway learned the tokenizer and follows both
            while metric(gateway, "dpgate_gateway_hashed_prompt_tokens_total") == 0:
                assert time.monotonic() < deadline, "the gateway never hashed a prompt"
                generate(stub, "warming up the gateway's tokenizer " * 4, salt="warm")
                time.sleep(0.2)
            predicted_before = metric(gateway, "dpgate_gateway_predicted_cached_tokens_total")
            text = "A long shared system prompt about routing by prefix caches. " * 12
            _, first_rank = generate(stub, text, salt="routing-test")
            reported = 0
            for _ in range(6):
                time.sleep(0.3)  # the engine's events for the last call reach the index
                reply, rank = generate(stub, text, salt="routing-test")
                assert rank == first_rank
                assert reply.finish.num_cached_prompt_tokens > 0
                reported += reply.finish.num_cached_prompt_tokens
            predicted = metric(gateway, "dpgate_gateway_predicted_cached_tokens_total") - predicted_before
            assert predicted == reported
            assert metric(gateway, 'dpgate_gateway_routed_by_reason_total{reason="cache"}') >= 6
            ranks = {generate(stub, f"cold prompt number {i} " * 6, salt=f"cold-{i}")[1] for i in range(6)}
            assert ranks == {0, 1}  # misses rotate: never the same engine on every miss
            index_blocks = metric(gateway, "dpgate_gateway_kv_index_blocks")
            assert index_blocks > 0
    finally:
        gateway.stop()


def chat(stub, messages: list[pb.ChatMessage], salt: str) -> tuple[pb.ChatResponse, int]:
    stopping = pb.StoppingCriteria(max_tokens=3, ignore_eos=True)
    request = pb.ChatRequest(messages=messages, stopping=stopping, cache_salt=salt)
    reply, call = stub.Chat.with_call(request, timeout=60)
    return reply, served_rank(call)


def test_later_turns_of_a_chat_follow_the_engine_holding_the_earlier_ones(engines: list[EngineProcess], log_dir):
    """Chat messages are rendered by the gateway as the engine renders them (dpgate/chat/), so the
    second and third turns of each conversation go where the first was computed, and the tokens the
    gateway predicted cached equal the tokens the engines report cached."""
    gateway = GatewayProcess([e.address for e in engines], *FAST_HEALTH, log_dir=log_dir, name="chat-cache-gateway")
    try:
        gateway.wait_ranks([0, 1])
        with grpc.insecure_channel(gateway.address) as channel:
            stub = inference_stub(channel)
            deadline = time.monotonic() + 60
            while metric(gateway, "dpgate_gateway_hashed_prompt_tokens_total") == 0:
                assert time.monotonic() < deadline, "the gateway never hashed a chat prompt"
                chat(stub, [pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="warming up " * 20)], salt="warm")
                time.sleep(0.2)
            predicted_before = metric(gateway, "dpgate_gateway_predicted_cached_tokens_total")
            reported = 0
            first_ranks = []
            for c in range(4):
                system = f"Conversation {c}: you answer questions about prefix caches and routing. " * 6
                history = [
                    pb.ChatMessage(role=pb.CHAT_ROLE_SYSTEM, content=system),
                    pb.ChatMessage(role=pb.CHAT_ROLE_USER, content=f"First question of conversation {c}, über Zürich?"),
                ]
                reply, first_rank = chat(stub, history, salt=f"chat-{c}")
                first_ranks.append(first_rank)
                for turn in (2, 3):
                    time.sleep(0.3)  # the engine's events for the last turn reach the index
                    history.append(pb.ChatMessage(role=pb.CHAT_ROLE_ASSISTANT, content=reply.content))
                    history.append(pb.ChatMessage(role=pb.CHAT_ROLE_USER, content=f"Turn {turn}: and then? 東京"))
                    reply, rank = chat(stub, history, salt=f"chat-{c}")
                    assert rank == first_rank, f"turn {turn} of conversation {c} left the engine holding it"
                    assert reply.finish.num_cached_prompt_tokens > 0
                    reported += reply.finish.num_cached_prompt_tokens
            predicted = metric(gateway, "dpgate_gateway_predicted_cached_tokens_total") - predicted_before
            assert predicted == reported
            assert set(first_ranks) == {0, 1}  # new conversations spread over both engines
    finally:
        gateway.stop()
