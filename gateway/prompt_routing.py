"""What cache-aware routing learns from a Generate call's prompt: how much of it each engine holds.

Only unpinned Generate/GenerateStream calls are read, and only when some engine publishes KV events
and its tokenizer is known; every other call keeps the raw relay. The request message is already
buffered whole (gateway/forwarded_call.py reads it before choosing an engine), so this parses only
the prompt, the salt and the prompt-logprobs switch. Text is tokenized with the engine's own
tokenizer and the blocks hashed with the engine's documented function (gateway/routing/
block_hashes.py), with the call's tenant and cache_salt, on a worker thread: about 2 ms for a
1,000-token prompt here (encoding 1.9 ms, hashing 0.08 ms), which must not stall the event loop.
Chat calls are routed by load: rendering messages exactly as the engine does needs its Jinja
environment, tools and thinking rules (docs/gateway.md, "Cache-aware routing" says what is left).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from dpgate.v1 import generate_pb2
from gateway.engine_pool import EnginePool
from gateway.prompt_tokenizers import PromptTokenizers
from gateway.routing.block_hashes import block_chain
from gateway.routing.filters import PromptBlocks
from gateway.routing.in_flight import InFlightPrefixes

_MESSAGES = {"Generate": generate_pb2.GenerateRequest, "GenerateStream": generate_pb2.GenerateStreamRequest}


@dataclass(slots=True, frozen=True)
class _HashGroup:
    """Engines that hash a prompt the same way: one tokenizer, one root, one block size."""

    fingerprint: str
    root: int
    block_size: int
    addresses: tuple[str, ...]


class PromptRouter:
    """Turns a buffered request message into the `PromptBlocks` the cache-aware policy scores."""

    def __init__(self, pool: EnginePool, tenants: dict[bytes, str]) -> None:
        self._pool = pool
        self._tenants = tenants  # `authorization` value -> tenant, when keys are isolated
        self.tokenizers: PromptTokenizers = pool.prompt_tokenizers
        self.in_flight = InFlightPrefixes()

    def applies(self, rpc: str, rank: int | None) -> bool:
        """Whether the call is worth reading: an unpinned Generate while some engine's cache is indexed."""
        return rank is None and rpc in _MESSAGES and bool(self._pool.kv_index.addresses()) and bool(self._groups())

    def _groups(self) -> list[_HashGroup]:
        groups: dict[tuple[str, int, int], list[str]] = {}
        indexed = set(self._pool.kv_index.addresses())
        for engine in self._pool.connected():
            identity = engine.identity
            assert identity is not None  # connected() lists handshaken engines only
            if engine.address in indexed and self.tokenizers.knows(identity.tokenizer_fingerprint):
                key = (identity.tokenizer_fingerprint, identity.prefix_cache_root_hash, identity.kv_block_size)
                groups.setdefault(key, []).append(engine.address)
        return [_HashGroup(f, r, b, tuple(a)) for (f, r, b), a in groups.items()]

    async def prompt_blocks(self, rpc: str, request: bytes, authorization: bytes | None) -> PromptBlocks | None:
        """The prompt's length and each indexed engine's cached tokens of it; None when the call
        cannot use the cache (prompt logprobs skip the lookup) or the body is not readable (the
        engine answers that one with its own error)."""
        try:
            message = _MESSAGES[rpc].FromString(request)
        except DecodeError:  # the engine answers it with its own INVALID_ARGUMENT
            return None
        if message.HasField("prompt_logprobs"):
            return None
        kind = message.WhichOneof("prompt")
        if kind is None:
            return None
        tenant = self._tenants.get(authorization, "") if authorization is not None else ""
        groups = self._groups()
        if not groups:
            return None
        text = message.text if kind == "text" else None
        ids = list(message.token_ids.ids) if kind == "token_ids" else None
        num_tokens, chains = await asyncio.to_thread(
            _chains, self.tokenizers, groups, text, ids, tenant, message.cache_salt
        )
        # The lookups run here on the loop, where the index is edited, never on the worker thread.
        index = self._pool.kv_index
        matched: dict[str, int] = {}
        cached: dict[str, int] = {}
        chains_by_address: dict[str, tuple[int, ...]] = {}
        for group, chain in zip(groups, chains, strict=True):
            found, opening = index.matched_blocks(chain), self.in_flight.matched_blocks(chain)
            as_tuple = tuple(chain)
            for address in group.addresses:
                chains_by_address[address] = as_tuple
                cached[address] = found.get(address, 0) * group.block_size
                matched[address] = max(found.get(address, 0), opening.get(address, 0)) * group.block_size
        return PromptBlocks(num_tokens, matched, cached, chains_by_address)

    def opened(self, address: str, prompt: PromptBlocks) -> None:
        """A call with this prompt now runs on `address`: its prefix counts there until it ends."""
        chain = prompt.chains.get(address)
        if chain:
            self.in_flight.add(address, chain)

    def closed(self, address: str, prompt: PromptBlocks) -> None:
        chain = prompt.chains.get(address)
        if chain:
            self.in_flight.remove(address, chain)

def _chains(
    tokenizers: PromptTokenizers,
    groups: list[_HashGroup],
    text: str | None,
    ids: list[int] | None,
    tenant: str,
    salt: str,
) -> tuple[int, list[list[int]]]:
    """The prompt's length and its block chain for each group: tokenized once per tokenizer.
    Blocking (Rust tokenizer, SHA-256 per block): runs on a worker thread."""
    chains: list[list[int]] = []
    num_tokens = 0
    encoded: dict[str, list[int]] = {}
    for group in groups:
        if ids is not None:
            tokens = ids
        else:
            assert text is not None  # a prompt is text or ids
            tokens = encoded.get(group.fingerprint)
            if tokens is None:
                tokens = encoded[group.fingerprint] = tokenizers.encode(group.fingerprint, text)
        num_tokens = max(num_tokens, len(tokens))
        chains.append(block_chain(tokens, group.root, group.block_size, tenant, salt))
    return num_tokens, chains
