"""What cache-aware routing learns from a call's prompt: how much of it each engine holds.

Only unpinned Generate/GenerateStream and Chat/ChatStream calls are read, and only when some engine
publishes KV events and its tokenizer is known; every other call keeps the raw relay. The request
message is already buffered whole (gateway/forwarded_call.py reads it before choosing an engine),
so this parses it here. Generate text is tokenized with the engine's own tokenizer (special tokens
added); Chat messages are rendered by the engine's own renderer (dpgate/chat/: its template,
special tokens, markers, tools and thinking rule) and encoded without adding special tokens, as
the engine does. The blocks are hashed with the engine's documented function (gateway/routing/
block_hashes.py), with the call's tenant and cache_salt. Encoding a 1,000-token text whole takes
1-2 ms, which must not stall the event loop: that (and rendering Chat) runs on a worker thread.
A text whose pieces are nearly all in the tokenizers' cache (a shared system prompt or history:
gateway/prompt_tokenizers.py), or a prompt of token ids, needs at most a short encode and the
hashing (0.05 ms for 1,000 tokens), cheaper than the hop to a thread and back: that runs here on
the loop (bounded by `INLINE_MAX_*`).
bench/cache_aware_path.py measures the whole path against the relay path.
A Chat call the renderer refuses (the engine will refuse it too, naming the field) is routed by load.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from dpgate.chat.request import ChatLike
from dpgate.invalid_request import InvalidRequestError
from dpgate.v1 import generate_pb2
from gateway.engine_pool import EnginePool
from gateway.prompt_tokenizers import Encoded, PromptTokenizers
from gateway.routing.block_hashes import block_chain
from gateway.routing.chain_cache import ChainCache
from gateway.routing.filters import PromptBlocks
from gateway.routing.in_flight import InFlightPrefixes

_MESSAGES = {
    "Generate": generate_pb2.GenerateRequest,
    "GenerateStream": generate_pb2.GenerateStreamRequest,
    "Chat": generate_pb2.ChatRequest,
    "ChatStream": generate_pb2.ChatStreamRequest,
}
_CHAT = frozenset({"Chat", "ChatStream"})
# What the event loop does itself, each about 0.2-0.4 ms at most (a worker thread does more): hash
# up to this many tokens (~0.05 ms per 1,000), look up the pieces of up to this many chars (~1 us
# per 256), and encode up to this many chars missing from the cache (~0.15 ms per 1,000).
INLINE_MAX_TOKENS = 8192
INLINE_MAX_CHARS = 32768
INLINE_MAX_NEW_CHARS = 1024


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
        self.in_flight: InFlightPrefixes = pool.in_flight_prefixes  # the engines' announcements feed it too
        self.chains = ChainCache()  # block hashes of text prefixes already hashed

    def applies(self, rpc: str, rank: int | None) -> bool:
        """Whether the call is worth reading: an unpinned Generate or Chat while some engine's cache is indexed."""
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
        cannot use the cache (prompt logprobs skip the lookup), no indexed engine's template is
        known (Chat), or the body is not readable or renderable (the engine answers that one with
        its own error)."""
        try:
            message = _MESSAGES[rpc].FromString(request)
        except DecodeError:  # the engine answers it with its own INVALID_ARGUMENT
            return None
        tenant = self._tenants.get(authorization, "") if authorization is not None else ""
        if rpc in _CHAT:
            groups = [g for g in self._groups() if self.tokenizers.renders_chat(g.fingerprint)]
            if not groups:
                return None
            prompt = _Prompt(chat=message)
        else:
            if message.HasField("prompt_logprobs"):
                return None
            kind = message.WhichOneof("prompt")
            if kind is None:
                return None
            groups = self._groups()
            if not groups:
                return None
            prompt = _Prompt(text=message.text) if kind == "text" else _Prompt(ids=list(message.token_ids.ids))
        encoded = self._known_ids(groups, prompt)
        try:
            if encoded is None:
                num_tokens, chains = await asyncio.to_thread(
                    _chains, self.tokenizers, self.chains, groups, prompt, tenant, message.cache_salt, {}
                )
            else:
                num_tokens, chains = _chains(
                    self.tokenizers, self.chains, groups, prompt, tenant, message.cache_salt, encoded
                )
        except (InvalidRequestError, RecursionError):  # the engine refuses it too (naming the field): route by load
            return None
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

    def _known_ids(self, groups: list[_HashGroup], prompt: _Prompt) -> dict[str, Encoded] | None:
        """Each group's ids when they cost little enough to get here (`INLINE_MAX_*`): the ids of
        a token-id prompt, a text's from the piece cache plus a short encode; None sends the work
        to a worker thread."""
        if prompt.ids is not None:
            return {} if len(prompt.ids) <= INLINE_MAX_TOKENS else None
        if prompt.text is None or len(prompt.text) > INLINE_MAX_CHARS:
            return None  # Chat: the template is rendered on a worker thread
        encoded: dict[str, Encoded] = {}
        for group in groups:
            if group.fingerprint not in encoded:
                text = self.tokenizers.encode_mostly_cached(group.fingerprint, prompt.text, INLINE_MAX_NEW_CHARS)
                if text is None or len(text.ids) > INLINE_MAX_TOKENS:
                    return None
                encoded[group.fingerprint] = text
        return encoded

    def opened(self, address: str, prompt: PromptBlocks) -> None:
        """A call with this prompt now runs on `address`: its prefix counts there until it ends."""
        chain = prompt.chains.get(address)
        if chain:
            self.in_flight.add(address, chain)

    def closed(self, address: str, prompt: PromptBlocks) -> None:
        chain = prompt.chains.get(address)
        if chain:
            self.in_flight.remove(address, chain)


@dataclass(slots=True, frozen=True)
class _Prompt:
    """A call's prompt as it came: Generate text, Generate token ids, or a Chat request to render."""

    text: str | None = None
    ids: list[int] | None = None
    chat: ChatLike | None = None


def _chains(
    tokenizers: PromptTokenizers,
    chain_cache: ChainCache,
    groups: list[_HashGroup],
    prompt: _Prompt,
    tenant: str,
    salt: str,
    encoded: dict[str, Encoded],
) -> tuple[int, list[list[int]]]:
    """The prompt's length and its block chain for each group: tokenized once per tokenizer
    (`encoded` holds the texts already encoded, by fingerprint, and gains the rest). Blocking when
    it encodes (Jinja, Rust tokenizer): then it runs on a worker thread; SHA-256 per block, but
    for the prefix of a text encoded piece by piece that was hashed before (`chain_cache`)."""
    chains: list[list[int]] = []
    num_tokens = 0
    for group in groups:
        if prompt.ids is not None:
            num_tokens = len(prompt.ids)
            chains.append(block_chain(prompt.ids, group.root, group.block_size, tenant, salt))
            continue
        text = encoded.get(group.fingerprint)
        if text is None:
            if prompt.chat is not None:
                text = tokenizers.encode_chat(group.fingerprint, prompt.chat)
            else:
                assert prompt.text is not None  # a prompt is text, ids or chat messages
                text = tokenizers.encode(group.fingerprint, prompt.text)
            encoded[group.fingerprint] = text
        num_tokens = max(num_tokens, len(text.ids))
        if text.pieces is None or text.piece_ids is None:
            chains.append(block_chain(text.ids, group.root, group.block_size, tenant, salt))
        else:
            chains.append(chain_cache.block_chain(
                text.ids, text.pieces, text.piece_ids, text.prefix_ids, group.root, group.block_size, tenant, salt
            ))  # fmt: skip
    return num_tokens, chains
