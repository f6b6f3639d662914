"""How one engine's model is split over its tensor-parallel (TP) ranks, and its KV cache over its
decode-context-parallel (DCP) ranks: pure arithmetic on sizes, checked once at start.

TP (Megatron-style): rank r of T holds query heads [r * H/T, (r + 1) * H/T), the intermediate
slice [r * I/T, (r + 1) * I/T) of the MLP and the vocabulary rows [r * V', (r + 1) * V') with
V' = ceil(V / T). The layers Megatron splits by their input (o_proj, down_proj) are split by
their output instead, rows [r * D/T, (r + 1) * D/T) of the hidden size D, so that each output is
one whole sum, as at T = 1 (engines/parallel/layers.py says why).
KV heads: with KVH >= T each rank holds KVH / T of them; with fewer, each KV
head is replicated over T / KVH consecutive ranks (rank r holds head r * KVH // T).

DCP (inside the TP group, T % C == 0): the ranks that replicate a KV head split its tokens
instead, in groups of C consecutive ranks: position p lives on the group's rank (p // I) % C.
So C can be at most T / KVH (the ranks of a group must hold the same KV head). A KV-cache block
then holds B * C positions (B per rank), and the KV memory per rank is 1/C of the C = 1 case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from engines.model.config import ModelConfig


class ParallelConfigError(ValueError):
    """One sentence naming the flag and the rule it breaks."""


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    tp_size: int = 1
    dcp_size: int = 1
    interleave: int = 1  # --dcp-kv-interleave: consecutive positions a DCP rank holds

    @property
    def is_parallel(self) -> bool:
        return self.tp_size > 1

    def check_flags(self, block_size: int, num_cores: int, allow_oversubscribe: bool) -> None:
        """The rules that need no model: raised before anything is loaded."""
        t, c, i = self.tp_size, self.dcp_size, self.interleave
        if t < 1:
            raise ParallelConfigError(f"--tensor-parallel-size {t} must be >= 1")
        if c < 1 or t % c:
            raise ParallelConfigError(
                f"--decode-context-parallel-size {c} must be >= 1 and divide --tensor-parallel-size {t}"
            )
        if i < 1 or block_size % i:
            raise ParallelConfigError(f"--dcp-kv-interleave {i} must be >= 1 and divide --block-size {block_size}")
        if t > num_cores and not allow_oversubscribe:
            raise ParallelConfigError(
                f"--tensor-parallel-size {t} is more than the {num_cores} cores available; "
                "add --allow-oversubscribe to run it anyway"
            )

    def check_model(self, config: ModelConfig) -> None:
        """The rules that need the model's shape (its config is read before its weights)."""
        t, c = self.tp_size, self.dcp_size
        if config.num_heads % t:
            raise ParallelConfigError(
                f"--tensor-parallel-size {t} must divide the model's {config.num_heads} query heads"
            )
        if config.hidden_size % t:
            raise ParallelConfigError(
                f"--tensor-parallel-size {t} must divide the model's hidden size {config.hidden_size}"
            )
        kv = config.num_kv_heads
        if (kv % t if kv >= t else t % kv) or config.intermediate_size % t:
            raise ParallelConfigError(
                f"--tensor-parallel-size {t} must divide, or be a multiple of, the model's {kv} KV heads "
                f"and divide its intermediate size {config.intermediate_size}"
            )
        if c > 1 and c > t // kv:
            raise ParallelConfigError(
                f"--decode-context-parallel-size {c} must be at most --tensor-parallel-size / KV heads = "
                f"{t}/{kv}: the ranks of a DCP group must hold the same KV head"
            )
        if c > 1 and (t // kv) % c:
            raise ParallelConfigError(
                f"--decode-context-parallel-size {c} must divide the {t // kv} ranks that replicate each KV head"
            )

    # --- one rank's share -------------------------------------------------------------------
    def heads(self, config: ModelConfig) -> int:
        return config.num_heads // self.tp_size

    def hidden_rows(self, config: ModelConfig) -> int:
        """Output rows of o_proj and down_proj on each rank."""
        return config.hidden_size // self.tp_size

    def kv_heads(self, config: ModelConfig) -> int:
        return max(1, config.num_kv_heads // self.tp_size)

    def first_kv_head(self, config: ModelConfig, rank: int) -> int:
        if config.num_kv_heads >= self.tp_size:
            return rank * self.kv_heads(config)
        return rank * config.num_kv_heads // self.tp_size

    def vocab_rows(self, config: ModelConfig) -> int:
        return math.ceil(config.vocab_size / self.tp_size)

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The shapes a rank's modules are built with (the vocabulary: its rows)."""
        return replace(
            config,
            num_heads=self.heads(config),
            num_kv_heads=self.kv_heads(config),
            intermediate_size=config.intermediate_size // self.tp_size,
            vocab_size=self.vocab_rows(config),
        )

    def dcp_rank(self, rank: int) -> int:
        return rank % self.dcp_size

    def dcp_group(self, rank: int) -> tuple[int, ...]:
        first = rank - self.dcp_rank(rank)
        return tuple(range(first, first + self.dcp_size))

    def tokens_per_block(self, block_size: int) -> int:
        """Positions one KV-cache block holds across a DCP group (B per rank)."""
        return block_size * self.dcp_size

    def workspace_tokens(self, max_tokens: int, block_size: int) -> int:
        """Exchange workspace rows: max_tokens rounded up to lcm(block_size, C * I)."""
        align = math.lcm(block_size, self.dcp_size * self.interleave)
        return -(-max_tokens // align) * align
