"""The perplexity gate by hand: one `dpgate engine` of MODEL with the given engine flags behind a
`dpgate gateway`; run dpgate/e2e/gates/perplexity.py against the gateway, print the figures as
one JSON line.

    python bench/perplexity_gate.py --model smollm2-135m-instruct [--no-cache] [-- --quantization none]

Each run starts fresh processes; the reference is read from the cache unless --no-cache (then
it is computed, and the cold cost shows in reference_seconds). --served-only scores the served
side alone (another configuration of the same model against a reference measured once).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine import describe_machine
from dpgate.e2e.contracts import Target, Topology
from dpgate.e2e.gates import perplexity
from dpgate.e2e.gates.perplexity_math import make_windows
from tests.support.processes import free_port, running


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-windows", type=int, default=None)
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--served-only", action="store_true", help="skip the reference")
    parser.add_argument("engine_flags", nargs="*", help="after --: flags for each engine (e.g. --quantization none)")
    args = parser.parse_args()
    port, engine_port = free_port(), free_port()
    engine = ["engine", "--port", str(engine_port), "--model", args.model, *args.engine_flags]
    gateway = ["gateway", "--port", str(port), "--engine", f"127.0.0.1:{engine_port}"]
    launched = time.monotonic()
    with (
        running(engine, engine_port, timeout=900, log_path=f"/tmp/dpgate-perplexity-engine-{engine_port}.log"),
        running(gateway, port, timeout=120, log_path=f"/tmp/dpgate-perplexity-gateway-{port}.log"),
    ):
        ready = time.monotonic() - launched
        target = Target(f"127.0.0.1:{port}", (), Topology(model=args.model), time.monotonic() + args.timeout)
        if args.served_only:
            print(describe_machine())
            print(json.dumps({"model": args.model, "engine_flags": args.engine_flags, **served_only(target, args)}))
            return
        result = perplexity.run(target, max_windows=args.max_windows, use_cache=not args.no_cache)
    figures = {"model": args.model, "engine_flags": args.engine_flags, "passed": result.passed, **result.figures}
    figures["serve_ready_seconds"] = round(ready, 1)
    print(describe_machine())
    print(json.dumps(figures))
    if result.detail:
        print(result.detail)


def served_only(target: Target, args: argparse.Namespace) -> dict:
    from engines.model.source import resolve_model
    from engines.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model(args.model))
    text = perplexity.TEXT_PATH.read_text(encoding="utf-8")
    ids = list(tokenizer.tokenizer(text, add_special_tokens=False).input_ids)
    windows = make_windows(ids, perplexity.WINDOW_TOKENS, tokenizer.bos_token_id, args.max_windows)
    started = time.monotonic()
    total = perplexity.score_through_gateway(target, windows)
    scored = sum(w.num_scored for w in windows)
    return {
        "served_perplexity": round(math.exp(-total / scored), 6),
        "tokens_scored": scored,
        "served_seconds": round(time.monotonic() - started, 2),
    }


if __name__ == "__main__":
    main()
