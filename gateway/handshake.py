"""The engine handshake rules (DESIGN.md rule 3): pure checks over what engines report.

The data-parallel size belongs to the engines: each reports its rank and the deployment's size in
GetServerInfo, and the gateway only checks that the reports agree. The first engine accepted fixes
the deployment's size and model; a later engine that disagrees is refused (one log line, one
metric) and never routed to, so a misconfigured engine cannot take a rank's traffic silently.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class EngineIdentity:
    """What an engine said about itself in GetServerInfo, plus where it was reached."""

    address: str
    rank: int
    data_parallel_size: int
    model: str
    version: str = ""
    tensor_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    max_model_len: int = 0
    kv_block_size: int = 0
    num_kv_blocks: int = 0
    # Whether the engine keeps a prefix cache (and so publishes WatchKvEvents), and the parent
    # hash of its sequences' first blocks (engines agree on it when they compute the same KV).
    prefix_caching: bool = False
    prefix_cache_root_hash: int = 0
    # GetTokenizerResponse.fingerprint: engines of one model must turn text into the same ids.
    tokenizer_fingerprint: str = ""


class RefusalReason(enum.Enum):
    """Why an engine was refused; the value is the metric label."""

    INVALID_DP_SIZE = "invalid_dp_size"
    DP_SIZE_MISMATCH = "dp_size_mismatch"
    RANK_OUT_OF_RANGE = "rank_out_of_range"
    DUPLICATE_RANK = "duplicate_rank"
    MODEL_MISMATCH = "model_mismatch"
    TOKENIZER_MISMATCH = "tokenizer_mismatch"


@dataclass(slots=True, frozen=True)
class Refusal:
    reason: RefusalReason
    message: str


def check_engine(candidate: EngineIdentity, accepted: Iterable[EngineIdentity]) -> Refusal | None:
    """Return why `candidate` must be refused given the engines already accepted, or None.

    An engine at the candidate's own address is ignored: a restarted engine re-handshakes and
    replaces its earlier self.
    """
    others = [engine for engine in accepted if engine.address != candidate.address]
    where = f"engine {candidate.address}"
    if candidate.data_parallel_size < 1:
        return Refusal(
            RefusalReason.INVALID_DP_SIZE,
            f"{where} reports data parallel size {candidate.data_parallel_size}; it must be at least 1",
        )
    if others and others[0].data_parallel_size != candidate.data_parallel_size:
        return Refusal(
            RefusalReason.DP_SIZE_MISMATCH,
            f"{where} reports data parallel size {candidate.data_parallel_size} but connected engines "
            f"report {others[0].data_parallel_size}",
        )
    if candidate.rank >= candidate.data_parallel_size:
        return Refusal(
            RefusalReason.RANK_OUT_OF_RANGE,
            f"{where} reports data parallel rank {candidate.rank}, outside 0..{candidate.data_parallel_size - 1}",
        )
    for other in others:
        if other.rank == candidate.rank:
            return Refusal(
                RefusalReason.DUPLICATE_RANK,
                f"{where} reports data parallel rank {candidate.rank}, already served by {other.address}",
            )
    if others and others[0].model != candidate.model:
        return Refusal(
            RefusalReason.MODEL_MISMATCH,
            f"{where} serves model {candidate.model!r} but connected engines serve {others[0].model!r}",
        )
    # An engine too old to report a fingerprint reports "": it is compared like any other value,
    # so a deployment is either all reporting the same one or all silent.
    if others and others[0].tokenizer_fingerprint != candidate.tokenizer_fingerprint:
        return Refusal(
            RefusalReason.TOKENIZER_MISMATCH,
            f"{where} reports tokenizer fingerprint {candidate.tokenizer_fingerprint[:16] or 'none'} but connected "
            f"engines of model {candidate.model!r} report {others[0].tokenizer_fingerprint[:16] or 'none'}",
        )
    return None
