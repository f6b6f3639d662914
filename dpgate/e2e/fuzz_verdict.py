"""Which answers to a fuzz request are documented, and the verdict over all of them.

Pure: outcomes are short labels, counted per request kind, so the rule is tested without servers
(tests/dpgate/e2e/test_fuzz_verdict.py, including that an INTERNAL fails it). Labels: a gRPC status code
name ("OK", "INVALID_ARGUMENT", ...), "reset:CODE" (RST_STREAM), "goaway:CODE" (GOAWAY), "closed"
(the connection ended without either), "client:ERROR" (our own client failed: a bug of the fuzzer).

Documented, for what the fuzzer sends to a healthy deployment (docs/gateway.md "Status codes" and
"Calls in flight", the proto comments): INVALID_ARGUMENT for bad input (fields out of range, bodies
that are not one valid message, bad rank metadata, ranks not connected), NOT_FOUND for an unknown
model or health service, RESOURCE_EXHAUSTED for messages or header lists over the limits and
requests too large for the engine, UNIMPLEMENTED for unknown methods and encodings, OK, and
DEADLINE_EXCEEDED when the client's own deadline passed (random fields may ask a real model for
thousands of tokens: the gateway passes the deadline on and the engine stops at it). The sender
labels a DEADLINE_EXCEEDED that came before the call's deadline "DEADLINE_EXCEEDED:early": that
one no server may give, and it fails the verdict.
UNAVAILABLE is documented only for unhealthy, missing or draining engines, none of which a healthy
deployment has: here it means a server stopped serving, so it fails the verdict like INTERNAL
(engine failure) and UNKNOWN (an exception nobody mapped).
"""

from __future__ import annotations

from collections import Counter

DOCUMENTED_CODES = frozenset(
    {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED", "DEADLINE_EXCEEDED"}
)
EARLY_DEADLINE = "DEADLINE_EXCEEDED:early"
# A request cut off mid-frame cannot be answered on its stream: the gateway may only end the
# connection, quietly or with the GOAWAY RFC 9113 names for a frame that cannot be parsed.
CUT_FRAME_OUTCOMES = frozenset({"closed", "goaway:NO_ERROR", "goaway:PROTOCOL_ERROR", "goaway:FRAME_SIZE_ERROR"})
NEVER = frozenset({"INTERNAL", "UNKNOWN", "goaway:INTERNAL_ERROR", "reset:INTERNAL_ERROR"})


def allowed(kind: str, outcome: str) -> bool:
    """Whether `outcome` is a documented answer to a request of `kind` (see fuzz_cases.FuzzCase)."""
    if outcome in NEVER:
        return False
    if kind == "cut-http2-frame":
        return outcome in CUT_FRAME_OUTCOMES or outcome in DOCUMENTED_CODES
    return outcome in DOCUMENTED_CODES


def problems(outcomes: Counter[tuple[str, str]]) -> list[str]:
    """One sentence per (kind, outcome) that is not documented, with how often it happened."""
    return [
        f"{count} {kind} request(s) got {outcome}, which is not a documented answer"
        for (kind, outcome), count in sorted(outcomes.items())
        if not allowed(kind, outcome)
    ]


def codes_seen(outcomes: Counter[tuple[str, str]]) -> dict[str, int]:
    """Outcomes counted over all kinds, most frequent first (the figure the report shows)."""
    totals: Counter[str] = Counter()
    for (_, outcome), count in outcomes.items():
        totals[outcome] += count
    return dict(totals.most_common())
