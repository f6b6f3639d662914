"""Per-call state shared between the interceptors and the servicer, carried in contextvars.

grpc.aio runs each call's interceptors and handler in the call's own task, so a value set by an
interceptor is visible to the handler and to nothing else.
"""

from __future__ import annotations

import contextvars

# The rank pinned by `x-data-parallel-rank`, None when the call is not pinned.
pinned_rank: contextvars.ContextVar[int | None] = contextvars.ContextVar("pinned_rank", default=None)
