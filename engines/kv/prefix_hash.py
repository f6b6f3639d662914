"""The prefix cache's block hash, defined byte for byte so another program (a router) can compute it.

Pure: hashlib and struct only. The same definition is written in proto/dpgate/v1/control.proto
(KvBlock) and docs/engine.md ("Prefix caching"); change all three together or not at all.

    root        = u64le(SHA-256(b"dpgate-kv-root-v1" || fingerprint)[0:8])
    extra       = u32le(len(tenant)) || tenant || u32le(len(cache_salt)) || cache_salt   (UTF-8 bytes)
    block_hash  = u64le(SHA-256(u64le(parent) || u32le(len(extra)) || extra
                                || u32le(token_0) || ... || u32le(token_{n-1}))[0:8])

`u64le(b)` reads 8 bytes as an unsigned little-endian integer (and writes one back the same way);
`u32le(x)` writes x as 4 unsigned little-endian bytes. The first block's parent is `root`, every
later block's parent is the hash of the block before it; n is the block size (only full blocks are
hashed). `fingerprint` is what the engine publishes (GetServerInfoResponse.prefix_cache_fingerprint):
two engines share hashes only when they would compute the same keys and values for the same tokens.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence

ROOT_DOMAIN = b"dpgate-kv-root-v1"

# (parent hash, extra keys, the block's token ids) -> the block's hash; a test may pass its own.
BlockHashFn = Callable[[int, bytes, Sequence[int]], int]


def root_hash(fingerprint: bytes) -> int:
    """The parent hash of every sequence's first block."""
    return int.from_bytes(hashlib.sha256(ROOT_DOMAIN + fingerprint).digest()[:8], "little")


def extra_keys(tenant: str = "", cache_salt: str = "") -> bytes:
    """A request's extra keys: the tenant (bound by the gateway) and the client's salt, both kept,
    so a salt can never stand in for a tenant (a salt "b" of tenant "a" differs from tenant "ab")."""
    tenant_bytes, salt_bytes = tenant.encode(), cache_salt.encode()
    return struct.pack("<I", len(tenant_bytes)) + tenant_bytes + struct.pack("<I", len(salt_bytes)) + salt_bytes


def block_hash(parent: int, extra: bytes, token_ids: Sequence[int]) -> int:
    """SHA-256 of the block's identity, truncated to its first 8 bytes read little-endian."""
    data = struct.pack("<QI", parent, len(extra)) + extra + struct.pack(f"<{len(token_ids)}I", *token_ids)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")
