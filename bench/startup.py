"""Time to SERVING: `dpgate engine` with the default model, from launch to grpc.health.v1 SERVING.

Each run is a fresh process, as a user starts it, with the caches `./dev.sh install` and a first
start leave behind (the kernel library, the converted tokenizer). The peer is transformers in a
fresh process: import, load the same GGUF, and compute one token's logits.

    python bench/startup.py [--runs 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import add_json_argument, write_results

from tests.support.processes import free_port, running

TRANSFORMERS_FIRST_TOKEN = """
import time, torch
started = time.monotonic()
from transformers import AutoModelForCausalLM
from engines.model.source import resolve_model
path = resolve_model("smollm2-135m-instruct").path
model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
with torch.inference_mode():
    model(torch.tensor([[1, 2, 3]]))
print(time.monotonic() - started)
"""


def engine_seconds_to_serving() -> float:
    port = free_port()
    with running(["engine", "--port", str(port)], port, timeout=300) as engine:
        return engine.seconds_to_serving


def transformers_seconds_to_first_token() -> float:
    started = time.monotonic()
    command = [sys.executable, "-c", TRANSFORMERS_FIRST_TOKEN]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    float(result.stdout.strip().splitlines()[-1])  # the child's own figure, as a sanity check
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    add_json_argument(parser)
    args = parser.parse_args()
    from machine import describe_machine

    print(f"SmolLM2-135M-Instruct, time from launch, {args.runs} runs each\n{describe_machine()}")
    ours = [engine_seconds_to_serving() for _ in range(args.runs)]
    theirs = [transformers_seconds_to_first_token() for _ in range(args.runs)]
    print(f"  dpgate engine to SERVING:           {' / '.join(f'{s:.1f}' for s in ours)} s")
    print(f"  transformers to a first token:      {' / '.join(f'{s:.1f}' for s in theirs)} s")
    print(f"dpgate / transformers (medians): {statistics.median(ours) / statistics.median(theirs):.2f}x the time")
    results = {"runs": args.runs, "dpgate_to_serving_s": ours, "transformers_to_first_token_s": theirs}
    write_results(args.json, "startup", results)


if __name__ == "__main__":
    main()
