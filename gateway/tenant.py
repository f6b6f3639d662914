"""Which tenant a call belongs to, for the engines' prefix cache: the identity of its API key.

With API keys and `--prefix-cache-sharing isolated` (the default), the gateway adds
`x-dpgate-tenant: <identity of the key that authorized the call>` to the request headers it
sends upstream. The identity is a one-way digest of the key, never the key: engines and their
logs never see a credential. A client cannot choose a tenant: the gateway forwards only the
headers it names (gateway/forwarding.py), so a client's own `x-dpgate-tenant` never reaches an
engine. The engine combines the tenant with the request's cache_salt (both kept, neither replaces
the other), so two keys never share a cached prompt. `--prefix-cache-sharing shared` sends no
tenant: every key shares the cache (a salt still separates requests that ask for it).
"""

from __future__ import annotations

import hashlib

from dpgate.tenant import TENANT_KEY
from gateway.http2.header_codec import encode_literal

SHARING_MODES = ("isolated", "shared")


def tenant_for_key(api_key: str) -> str:
    """A stable, one-way identity of an API key: the same on every gateway replica."""
    return "key-" + hashlib.sha256(b"dpgate-tenant-v1\0" + api_key.encode()).hexdigest()[:32]


def tenant_fields(api_keys: tuple[str, ...], sharing: str) -> dict[bytes, bytes]:
    """`authorization` header value -> the encoded tenant header field to send upstream (none when shared)."""
    if sharing == "shared":
        return {}
    return {
        f"Bearer {key}".encode(): encode_literal(TENANT_KEY.encode(), tenant_for_key(key).encode()) for key in api_keys
    }


def tenant_names(api_keys: tuple[str, ...], sharing: str) -> dict[bytes, str]:
    """`authorization` header value -> the tenant the engine hashes with (cache-aware routing), as sent."""
    if sharing == "shared":
        return {}
    return {f"Bearer {key}".encode(): tenant_for_key(key) for key in api_keys}
