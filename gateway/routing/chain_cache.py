"""The block hashes of prompt prefixes already hashed, found again by the text pieces they are made of.

A prompt encoded piece by piece (gateway/token_chunks.py) is a path of pieces; the block chain of
its first k pieces depends only on that path and the hashing context (root, block size, the
tenant/salt extra keys, the special ids before the first piece). So each path step is a node,
keyed exactly by (parent node, piece text), holding the hashes of the blocks that end within its
piece; a prompt that shares a prefix with an earlier one walks the shared nodes and hashes only
the blocks after them: ~0.1 us per piece against ~0.7 us per 16-token block (1,000 tokens: 5
against 46 us). Nodes live in a `BoundedLru`: one evicted makes its descendants unreachable, and
they age out in turn. Pure data, no asyncio.
"""

from __future__ import annotations

import itertools
import sys
from array import array
from collections.abc import Sequence

from gateway.bounded_lru import BoundedLru
from gateway.routing.block_hashes import hash_blocks, prefix_head, u32le

_NODE_BYTES = 120  # the key and value tuples around a node's piece and hashes


class ChainCache:
    """(parent node, piece) -> (node id, tokens through the piece, hashes of blocks ending in it)."""

    __slots__ = ("_ids", "_nodes")

    def __init__(self, nodes: BoundedLru | None = None) -> None:
        self._nodes = BoundedLru() if nodes is None else nodes
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._nodes)

    def block_chain(
        self,
        token_ids: Sequence[int],
        pieces: Sequence[str],
        piece_ids: Sequence[array],
        prefix_ids: tuple[int, ...],
        root: int,
        block_size: int,
        tenant: str = "",
        cache_salt: str = "",
    ) -> list[int]:
        """`block_chain(token_ids, ...)`, where `token_ids` is `prefix_ids`, then each piece's ids,
        then any special ids after them."""
        num_blocks = max(0, (len(token_ids) - 1) // block_size)
        if num_blocks == 0:
            return []
        head = prefix_head(tenant, cache_salt)
        context = ("context", root, block_size, head, prefix_ids)
        node = self._nodes.get(context)
        if node is None:  # the root node holds the blocks that end within the special ids
            num_prefix_bytes = 4 * block_size * (len(prefix_ids) // block_size)
            blocks = tuple(
                hash_blocks(u32le(prefix_ids)[:num_prefix_bytes], root.to_bytes(8, "little"), head, block_size)
            )
            node = (next(self._ids), len(prefix_ids), blocks)
            self._nodes.put(context, node, _NODE_BYTES + sys.getsizeof(head) + 8 * len(blocks))
        parent_id, end = node[0], node[1]
        chain = list(node[2])
        num_cached = 0
        for piece in pieces:
            found = self._nodes.get((parent_id, piece))
            if found is None:
                break
            parent_id, end, blocks = found
            chain.extend(blocks)
            num_cached += 1
        ends = list(itertools.accumulate((len(ids) for ids in piece_ids[num_cached:]), initial=end))[1:]
        num_hashed = max(num_blocks, ends[-1] // block_size if ends else 0)
        if num_hashed > len(chain):
            parent = (chain[-1] if chain else root).to_bytes(8, "little")
            data = u32le(token_ids)[4 * block_size * len(chain) : 4 * block_size * num_hashed]
            chain.extend(hash_blocks(data, parent, head, block_size))
        done = end // block_size
        for piece, piece_end in zip(pieces[num_cached:], ends, strict=True):
            blocks = tuple(chain[done : piece_end // block_size])
            done = piece_end // block_size
            node_id = next(self._ids)
            size = _NODE_BYTES + sys.getsizeof(piece) + 8 * len(blocks)
            self._nodes.put((parent_id, piece), (node_id, piece_end, blocks), size)
            parent_id = node_id
        return chain[:num_blocks]
