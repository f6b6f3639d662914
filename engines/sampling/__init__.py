"""The sampling room: request parameters and their validation, the sampler, and prompt logprob scoring."""
