"""The perplexity gate by hand: `dpgate serve` one engine of MODEL with the given engine flags,
run dpgate/e2e/gates/perplexity.py against its gateway, print the figures as one JSON line.

    python bench/perplexity_gate.py --model smollm2-135m-instruct [--no-cache] [-- --quantization none]

Each run is a fresh `dpgate serve`; the reference is read from the cache unless --no-cache (then
it is computed, and the cold cost shows in reference_seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine import describe_machine
from dpgate.e2e.contracts import Target, Topology
from dpgate.e2e.gates import perplexity
from tests.support.processes import free_port, running


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-windows", type=int, default=None)
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("engine_flags", nargs="*", help="after --: flags for each engine (e.g. --quantization none)")
    args = parser.parse_args()
    port = free_port()
    serve = ["serve", "--port", str(port), "--model", args.model, *args.engine_flags]
    launched = time.monotonic()
    with running(serve, port, timeout=600, log_path="/tmp/dpgate-perplexity-serve.log"):
        ready = time.monotonic() - launched
        target = Target(f"127.0.0.1:{port}", (), Topology(model=args.model), time.monotonic() + args.timeout)
        result = perplexity.run(target, max_windows=args.max_windows, use_cache=not args.no_cache)
    figures = {"model": args.model, "engine_flags": args.engine_flags, "passed": result.passed, **result.figures}
    figures["serve_ready_seconds"] = round(ready, 1)
    print(describe_machine())
    print(json.dumps(figures))
    if result.detail:
        print(result.detail)


if __name__ == "__main__":
    main()
