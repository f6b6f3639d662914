"""The scheduling room: a torch-free `Sequence`, the scheduler that batches them, and detokenization."""
