"""The runner room: loads a model for serving (tensor-parallel shards, worker processes) and runs a step."""
