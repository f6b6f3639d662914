"""Runs the model for one sequence at a time over a preallocated KV cache.

Prefill feeds the whole prompt in one forward; decode feeds the last sampled token. The runner
knows nothing of requests beyond token ids and how many are already cached.
"""

from __future__ import annotations

import torch

from engines.attention import AttentionMetadata, KVCache
from engines.loader import LoadedModel


class ModelRunner:
    def __init__(self, loaded: LoadedModel, max_model_len: int):
        self.model = loaded.model
        config = loaded.config
        self.cache = KVCache(config.num_layers, config.num_kv_heads, config.head_dim, max_model_len, loaded.dtype)
        self.max_model_len = max_model_len

    def forward(self, token_ids: list[int], num_cached: int) -> torch.Tensor:
        """Append `token_ids` after `num_cached` cached tokens; float32 logits [vocab] of the last one."""
        if num_cached + len(token_ids) > self.max_model_len:
            raise ValueError(
                f"sequence of {num_cached + len(token_ids)} tokens exceeds the cache ({self.max_model_len})"
            )
        ids = torch.tensor(token_ids, dtype=torch.long)
        return self.model(ids, self.cache, AttentionMetadata(num_cached, len(token_ids)))[0]

    def warm_up(self) -> None:
        """Run a prefill and a decode step so the first request pays no one-off cost and any
        missing buffer fails at start-up."""
        self.forward([0] * min(16, self.max_model_len - 1), 0)
        self.forward([0], min(16, self.max_model_len - 1))
