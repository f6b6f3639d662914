"""A prompt's prefix-cache block hashes, computed as the engine computes them (pure: hashlib, struct).

Written here from the definition in proto/dpgate/v1/control.proto (message KvBlock), not imported
from the engine (a gateway never imports engines/); tests/gateway/test_prompt_hashes_e2e.py checks
that the two agree on real prompts. `extra` is the tenant and the cache salt, each u32le
length-prefixed; every block hashes its parent's hash, the extra keys and its token ids.
"""

from __future__ import annotations

import hashlib
import struct
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
    extra = extra_keys(tenant, cache_salt)
    head = struct.pack("<I", len(extra)) + extra
    chain: list[int] = []
    parent = root
    for start in range(0, ((len(token_ids) - 1) // block_size) * block_size, block_size):
        block = token_ids[start : start + block_size]
        data = struct.pack("<Q", parent) + head + struct.pack(f"<{block_size}I", *block)
        parent = int.from_bytes(hashlib.sha256(data).digest()[:8], "little")
        chain.append(parent)
    return chain
