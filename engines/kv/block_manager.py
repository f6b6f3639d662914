"""Owns the paged KV cache's blocks: which are free, which sequences hold them, which are cached.

Pure bookkeeping, no torch: a block is an index into the runner's cache tensors. A block is in
exactly one of three places: held (reference count above 0, in one or more sequences' block
tables), cached and unreferenced (in the LRU, its keys and values kept for a later hit), or free.
`check_invariants` proves it and tests call it after every step.

Prefix caching (on when `enable_caching`): a full block whose keys and values are computed is
registered under `prefix_hash.block_hash` of (parent hash, extra keys, its token ids). A new
sequence's leading full blocks are looked up in that order; a hit is confirmed against the stored
entry — the same token ids, the same extra keys and the same parent *entry* (each registration
gets a serial number that is never reused) — so no hash collision, and no parent evicted and
replaced behind a child's back, can ever hand a sequence keys and values of other tokens. The
sequence's last token is never taken from the cache: its forward yields the first logits.
Allocation takes never-cached free blocks first, then evicts the least recently freed cached
block (a sequence's blocks are freed tail first, so its tail goes before its head).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from engines.kv.prefix_hash import BlockHashFn, block_hash

ROOT_SERIAL = 0  # the parent entry of every first block


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hash: int
    parent_hash: int
    num_tokens: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hash: int


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


@dataclass(frozen=True, slots=True)
class PrefixAnnounced:
    """A queued request's prompt will fill these blocks (its full blocks' hashes, in order)."""

    key: int
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PrefixSettled:
    """The announced prompt `key` is computed (its blocks' stored events came first) or gone."""

    key: int


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared | PrefixAnnounced | PrefixSettled


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """What a cached block holds the keys and values of."""

    block_hash: int
    parent_hash: int
    serial: int
    parent_serial: int
    extra: bytes
    token_ids: tuple[int, ...]

    def is_same(self, parent_serial: int, extra: bytes, token_ids: tuple[int, ...]) -> bool:
        """Whether this entry holds the keys and values of these tokens after that parent entry."""
        return self.parent_serial == parent_serial and self.extra == extra and self.token_ids == token_ids


@dataclass(slots=True)
class PrefixState:
    """A sequence's place in the prefix cache. `hashes[i]`: hash of its full block i (a function
    of its tokens and `extra` only). `serials[i]`: the cache entry its block i is equal to, for
    its leading registered blocks. `epoch`: the cache's epoch `serials` belong to (a reset starts
    a new one). `broken`: a collision stopped registering its later blocks."""

    extra: bytes = b""
    hashes: list[int] = field(default_factory=list)
    serials: list[int] = field(default_factory=list)
    epoch: int = 0
    broken: bool = False


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Cached blocks equal to a sequence's leading blocks, and their entries' serials."""

    blocks: tuple[int, ...] = ()
    serials: tuple[int, ...] = ()


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = False,
        root: int = 0,
        hash_fn: BlockHashFn = block_hash,
    ):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.root = root
        self.hash_fn = hash_fn
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first
        self.entries: dict[int, CacheEntry] = {}  # block -> what it caches
        self.by_hash: dict[int, int] = {}  # hash -> block
        self.events: list[KvEvent] = []  # since the owner last drained them
        self.epoch = 0
        self._next_serial = ROOT_SERIAL + 1
        self.num_query_tokens = 0  # prompt tokens looked up, for metrics
        self.num_hit_tokens = 0  # of which found cached

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: free ones and cached unreferenced ones."""
        return len(self.free_blocks) + len(self.evictable)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self.evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.entries)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences, in [0, 1] (cached unreferenced blocks are not used)."""
        return self.num_used_blocks / self.num_blocks

    def num_missing_blocks(self, block_table: list[int], num_tokens: int) -> int:
        """Blocks to add so `block_table` holds `num_tokens` tokens."""
        return max(0, blocks_needed(num_tokens, self.block_size) - len(block_table))

    def can_grow(self, block_table: list[int], num_tokens: int) -> bool:
        return self.num_missing_blocks(block_table, num_tokens) <= self.num_free_blocks

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        """Append free blocks to `block_table` until it holds `num_tokens` tokens."""
        missing = self.num_missing_blocks(block_table, num_tokens)
        if missing > self.num_free_blocks:
            raise RuntimeError(f"grow needs {missing} blocks but {self.num_free_blocks} are free")
        for _ in range(missing):
            block = self._take_block()
            self.ref_counts[block] = 1
            block_table.append(block)

    def free(self, block_table: list[int]) -> None:
        """Drop the table's references, tail first, and empty the table. A block nobody holds any
        more stays cached (in the LRU) when it is registered, else it is free."""
        for block in reversed(block_table):
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0, f"block {block} freed more often than taken"
            if self.ref_counts[block] == 0:
                if block in self.entries:
                    self.evictable[block] = None
                else:
                    self.free_blocks.append(block)
        block_table.clear()

    def update_hashes(self, state: PrefixState, token_ids: Sequence[int], num_tokens: int) -> None:
        """Extend `state.hashes` to every full block of the first `num_tokens` of `token_ids`."""
        size = self.block_size
        for index in range(len(state.hashes), num_tokens // size):
            parent = state.hashes[index - 1] if index else self.root
            state.hashes.append(self.hash_fn(parent, state.extra, token_ids[index * size : (index + 1) * size]))

    def match_prefix(self, state: PrefixState, token_ids: Sequence[int]) -> PrefixHit:
        """The cached blocks equal to the sequence's leading full blocks, all but its last token
        (which must be computed). Looks, takes nothing."""
        if not self.enable_caching or len(token_ids) < 2:
            return PrefixHit()
        self.update_hashes(state, token_ids, len(token_ids) - 1)
        size = self.block_size
        blocks, serials = [], []
        parent_serial = ROOT_SERIAL
        for index, hashed in enumerate(state.hashes[: (len(token_ids) - 1) // size]):
            block = self.by_hash.get(hashed)
            if block is None:
                break
            tokens = tuple(token_ids[index * size : (index + 1) * size])
            entry = self.entries[block]
            if not entry.is_same(parent_serial, state.extra, tokens):
                break  # a collision, or a parent evicted and replaced: not the same keys and values
            blocks.append(block)
            serials.append(entry.serial)
            parent_serial = entry.serial
        return PrefixHit(tuple(blocks), tuple(serials))

    def can_take(self, hit: PrefixHit, block_table: list[int], num_tokens: int) -> bool:
        """Whether `hit` can be taken into the empty `block_table` and the table grown to `num_tokens`."""
        reviving = sum(1 for block in hit.blocks if self.ref_counts[block] == 0)
        missing = max(0, blocks_needed(num_tokens, self.block_size) - len(block_table) - len(hit.blocks))
        return missing <= self.num_free_blocks - reviving

    def take(self, hit: PrefixHit, state: PrefixState, block_table: list[int], num_query_tokens: int) -> int:
        """Reference the hit's blocks from the empty `block_table`; returns the cached tokens."""
        assert not block_table, "a prefix is taken into an empty block table"
        for block in hit.blocks:
            if self.ref_counts[block] == 0:
                del self.evictable[block]
            self.ref_counts[block] += 1
            block_table.append(block)
        state.serials = list(hit.serials)
        state.epoch = self.epoch
        num_cached = len(hit.blocks) * self.block_size
        self.num_query_tokens += num_query_tokens
        self.num_hit_tokens += num_cached
        return num_cached

    def cache_blocks(
        self, state: PrefixState, block_table: list[int], num_computed: int, token_ids: Callable[[], Sequence[int]]
    ) -> None:
        """Register the table's full blocks whose keys and values are now computed. A block equal
        to one already cached is not registered twice (its equal is the chain's entry); one whose
        hash is taken by other tokens (a collision) stops registration for this sequence."""
        if not self.enable_caching or state.broken:
            return
        if state.epoch != self.epoch:  # the cache was reset: register the sequence's blocks afresh
            state.serials, state.epoch = [], self.epoch
        num_full = min(num_computed // self.block_size, len(block_table))
        if len(state.serials) >= num_full:
            return
        tokens = token_ids()
        self.update_hashes(state, tokens, num_full * self.block_size)
        size = self.block_size
        for index in range(len(state.serials), num_full):
            hashed = state.hashes[index]
            parent_serial = state.serials[index - 1] if index else ROOT_SERIAL
            block_tokens = tuple(tokens[index * size : (index + 1) * size])
            existing = self.by_hash.get(hashed)
            if existing is not None:
                entry = self.entries[existing]
                if not entry.is_same(parent_serial, state.extra, block_tokens):
                    state.broken = True
                    return
                state.serials.append(entry.serial)
                continue
            block = block_table[index]
            assert block not in self.entries, f"block {block} is cached under another hash"
            parent_hash = state.hashes[index - 1] if index else self.root
            entry = CacheEntry(hashed, parent_hash, self._next_serial, parent_serial, state.extra, block_tokens)
            self._next_serial += 1
            self.entries[block] = entry
            self.by_hash[hashed] = block
            state.serials.append(entry.serial)
            self.events.append(BlockStored(hashed, parent_hash, size))

    def reset(self) -> None:
        """Forget every cached block (held blocks stay with their sequences, uncached)."""
        self.free_blocks.extend(self.evictable)
        self.evictable.clear()
        self.entries.clear()
        self.by_hash.clear()
        self.epoch += 1
        self.events.append(AllBlocksCleared())

    def announce(self, key: int, state: PrefixState, token_ids: Sequence[int]) -> bool:
        """Say that a queued prompt will fill its full blocks (all but its last token's, as
        `match_prefix` looks them up): routers outside the engine then count them as on their way
        in. False (nothing said) when caching is off or the prompt has no full block."""
        if not self.enable_caching or len(token_ids) < 2:
            return False
        self.update_hashes(state, token_ids, len(token_ids) - 1)
        num_full = (len(token_ids) - 1) // self.block_size
        if num_full == 0:
            return False
        self.events.append(PrefixAnnounced(key, tuple(state.hashes[:num_full])))
        return True

    def settle(self, key: int) -> None:
        """The announced prompt `key` is computed or its request ended."""
        self.events.append(PrefixSettled(key))

    def drain_events(self) -> list[KvEvent]:
        events, self.events = self.events, []
        return events

    def _take_block(self) -> int:
        if self.free_blocks:
            return self.free_blocks.popleft()
        block, _ = self.evictable.popitem(last=False)
        entry = self.entries.pop(block)
        del self.by_hash[entry.block_hash]
        self.events.append(BlockRemoved(entry.block_hash))
        return block

    def check_invariants(self, block_tables: Iterable[list[int]]) -> None:
        """Every block is held (as often as tables name it), cached-unreferenced or free, exactly
        one of them (raises AssertionError otherwise)."""
        held = [0] * self.num_blocks
        for table in block_tables:
            for block in table:
                held[block] += 1
        assert held == self.ref_counts, "a table holds a block its reference count does not count"
        free, evictable = set(self.free_blocks), set(self.evictable)
        assert len(free) == len(self.free_blocks), "a block is on the free list twice"
        assert not free & evictable, "a block is both free and cached"
        unheld = {block for block in range(self.num_blocks) if held[block] == 0}
        assert free | evictable == unheld, "a block is lost, or held and free at once"
        assert evictable <= self.entries.keys() and not free & self.entries.keys(), "the LRU and the cache disagree"
        assert {e.block_hash: b for b, e in self.entries.items()} == self.by_hash, "hash index out of step"
