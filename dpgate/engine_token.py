"""The shared token a gateway shows its engines, so engines serve only calls that came through it.

An engine started with a token (`--engine-token-file FILE`, or the environment variable
DPGATE_ENGINE_TOKEN) refuses every call without metadata `x-dpgate-engine-token: TOKEN` with
UNAUTHENTICATED, except grpc.health.v1 (probes from Kubernetes, compose and the gateway's watcher
need no secret). A gateway given the same token sends it on every call to its engines: the
relayed data path and its control channel. `dpgate serve` makes a new token each run and hands it
to both through the environment, never a command line (which any local user can read).

Why a token rather than mutual TLS: it needs no certificate authority, works the same on one host,
in compose and in Kubernetes (a Secret), and costs one header compare per call. It keeps other
pods and local users from calling engines directly (and from aborting other clients' requests);
on an untrusted network add TLS as well, since the token travels in clear text. Lives in `dpgate`
because the engine and the gateway both read it and neither may import the other.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping

ENGINE_TOKEN_KEY = "x-dpgate-engine-token"
ENGINE_TOKEN_ENV = "DPGATE_ENGINE_TOKEN"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
UNAUTHENTICATED_MESSAGE = "this engine serves only its gateway: the call carries no valid engine token"


class EngineTokenError(ValueError):
    """The token source cannot be used; the message names the flag or variable."""


def new_engine_token() -> str:
    return secrets.token_urlsafe(32)


def read_engine_token(path: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The token from `path` (--engine-token-file; surrounding whitespace dropped), else from
    DPGATE_ENGINE_TOKEN, else None (no lock). Raises EngineTokenError for an unreadable or empty one."""
    if path is not None:
        try:
            with open(path, encoding="utf-8") as file:
                token = file.read().strip()
        except OSError as error:
            raise EngineTokenError(f"--engine-token-file {path} cannot be read: {error.strerror}") from None
        source = f"--engine-token-file {path}"
    else:
        text = environ.get(ENGINE_TOKEN_ENV)
        if text is None:
            return None
        token, source = text.strip(), f"${ENGINE_TOKEN_ENV}"
    if not token or any(char.isspace() or not char.isprintable() for char in token):
        raise EngineTokenError(f"{source} must hold one token of printable characters without spaces")
    return token


def token_matches(offered: list[str | bytes], token: str) -> bool:
    """Exactly one value, equal to `token`, compared in constant time."""
    if len(offered) != 1:
        return False
    value = offered[0]
    value = value.encode() if isinstance(value, str) else value
    return hmac.compare_digest(value, token.encode())
