"""The error a grammar raises about a request: its own module, so the matcher and the step's masks
both raise it without importing each other."""

from __future__ import annotations

from engines.sampling.params import InvalidRequestError


class GrammarConflictError(InvalidRequestError):
    """The grammar and the request's own rules leave no token to sample (INVALID_ARGUMENT)."""
