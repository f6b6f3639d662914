"""The metadata key that carries a request's tenant from the gateway to its engine.

The gateway strips any value a client sends under this key and, when it has API keys, adds the
identity of the key that made the request (never the key itself: gateway/tenant.py). The engine
folds it into the prefix cache's extra keys together with the request's cache_salt, so requests
of different tenants never share cached KV blocks (docs/gateway.md, docs/engine.md).
"""

from __future__ import annotations

TENANT_KEY = "x-dpgate-tenant"
MAX_TENANT_CHARS = 128


def tenant_from_metadata(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str:
    """The tenant a request's metadata names ("" when none). Only the gateway sets it."""
    for key, value in metadata or ():
        if key == TENANT_KEY and isinstance(value, str):
            return value[:MAX_TENANT_CHARS]
    return ""
