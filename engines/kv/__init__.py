"""The KV room: the block manager (pure bookkeeping of KV blocks) and the paged KV cache with its attention."""
