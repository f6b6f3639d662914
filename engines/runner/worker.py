"""`python -m engines.runner.worker`: one tensor-parallel worker process (see workers.py).
Its spec arrives pickled on standard input, once, from the engine process that started it."""

import pickle
import sys

from engines.runner.workers import worker_main

if __name__ == "__main__":
    spec, parent_pid = pickle.loads(sys.stdin.buffer.read())
    worker_main(spec, parent_pid)
