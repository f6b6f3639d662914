"""A prompt's prefix-cache block hashes, computed as the engine computes them (pure: hashlib, struct).

Written here from the definition in proto/dpgate/v1/control.proto (message KvBlock), not imported
from the engine (a gateway never imports engines/); tests/gateway/test_prompt_hashes_e2e.py checks
that the two agree on real prompts. `extra` is the tenant and the cache salt, each u32le
length-prefixed; every block hashes its parent's hash, the extra keys and its token ids.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Sequence


def extra_keys(tenant: str, cache_salt: str) -> bytes:
    tenant_bytes, salt_bytes = tenant.encode(), cache_salt.encode()
    return struct.pack("<I", len(tenant_bytes)) + tenant_bytes + struct.pack("<I", len(salt_bytes)) + salt_bytes


def block_chain(
    token_ids: Sequence[int], root: int, block_size: int, tenant: str = "", cache_salt: str = ""
) -> list[int]:
    """The hashes of the prompt's blocks an engine can take from its cache, first to last.

    Only full blocks are hashed, and at most `(len - 1) // block_size` of them: the engine always
    computes the last prompt token (its forward gives the first logits), so a block holding it is
    never taken from the cache.
    """
    num_bytes = ((len(token_ids) - 1) // block_size) * 4 * block_size
    if num_bytes <= 0:
        return []
    parent = root.to_bytes(8, "little")
    return hash_blocks(u32le(token_ids)[:num_bytes], parent, prefix_head(tenant, cache_salt), block_size)


def prefix_head(tenant: str, cache_salt: str) -> bytes:
    """What every block hashes between its parent and its ids: u32le(len(extra)) || extra."""
    extra = extra_keys(tenant, cache_salt)
    return struct.pack("<I", len(extra)) + extra


def hash_blocks(data: bytes, parent: bytes, head: bytes, block_size: int) -> list[int]:
    """The hashes of the blocks of `data` (u32le ids, a whole number of blocks) after `parent`
    (the u64le hash of the block before them, or of the root)."""
    sha256, step = hashlib.sha256, 4 * block_size
    digests = []
    for start in range(0, len(data), step):
        # u64le(parent) is the first 8 bytes of the parent's digest as they are: no int round trip.
        parent = sha256(parent + head + data[start : start + step]).digest()[:8]
        digests.append(parent)
    return [int.from_bytes(digest, "little") for digest in digests]


def u32le(token_ids: Sequence[int]) -> bytes:
    """The ids as u32le, all at once (an array('I') as it is on a little-endian machine)."""
    if isinstance(token_ids, array) and token_ids.typecode == "I" and token_ids.itemsize == 4:
        if sys.byteorder == "little":
            return token_ids.tobytes()
        swapped = array("I", token_ids)
        swapped.byteswap()
        return swapped.tobytes()
    return struct.pack(f"<{len(token_ids)}I", *token_ids)
