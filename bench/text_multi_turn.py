"""bench/prefix_cache.py's (a) as text over OpenAI's HTTP API, for peers that take text: `dpgate
serve` (gateway HTTP port, prefix cache on) against llama.cpp's server (prompt cache on), one after
the other on the same machine, with the same client, words and conversation shape.

Each conversation is a system prompt of about `system_tokens` tokens of words, then turns of about
`turn_tokens` words of the user's and the server's own streamed answer (`turn_tokens` tokens,
end-of-sequence tokens banned with logit_bias on both so every answer has the same length). TTFT is
the time from sending to the first chunk with text; output throughput counts streamed chunks (one a
token on both servers) over the workload's wall time.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from openai import OpenAI

WORDS = [
    "time",
    "person",
    "year",
    "way",
    "day",
    "thing",
    "man",
    "world",
    "life",
    "hand",
    "part",
    "child",
    "eye",
    "woman",
    "place",
    "work",
    "week",
    "case",
    "point",
    "government",
    "company",
    "number",
    "group",
    "problem",
    "fact",
    "river",
    "mountain",
    "garden",
    "window",
    "kitchen",
    "letter",
    "market",
    "station",
    "island",
    "forest",
    "winter",
    "summer",
    "music",
    "paper",
    "story",
    "answer",
    "question",
    "reason",
    "moment",
    "city",
    "country",
]


def text_of_tokens(tokenizer, rng: random.Random, count: int) -> str:
    """Words until the tokenizer counts about `count` tokens (each word is one token here)."""
    words: list[str] = []
    while len(tokenizer(" ".join(words), add_special_tokens=False).input_ids) < count:
        words.extend(rng.choice(WORDS) for _ in range(max(1, (count - len(words)) // 2)))
    return " ".join(words)


class TextRecorder:
    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.num_output = 0
        self.lock = threading.Lock()

    def stream(self, client: OpenAI, prompt: str, max_tokens: int, banned: dict[str, float]) -> str:
        started, first, pieces = time.perf_counter(), None, []
        stream = client.completions.create(
            model="", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True, logit_bias=banned
        )
        for chunk in stream:
            text = chunk.choices[0].text if chunk.choices else ""
            if text:
                first = first or time.perf_counter()
                pieces.append(text)
        with self.lock:
            self.ttft.append((first or time.perf_counter()) - started)
            self.num_output += len(pieces)
        return "".join(pieces)


def run_conversations(url: str, args, tokenizer, banned: dict[str, float]) -> dict:
    rng = random.Random(1)
    system = text_of_tokens(tokenizer, rng, args.system_tokens)
    users = [[text_of_tokens(tokenizer, rng, args.turn_tokens) for _ in range(args.turns)]
             for _ in range(args.conversations)]  # fmt: skip
    client = OpenAI(base_url=f"{url}/v1", api_key="none", timeout=3600, max_retries=0)
    TextRecorder().stream(client, "warm up", 4, banned)
    recorder = TextRecorder()

    def conversation(index: int) -> None:
        history = system
        for user in users[index]:
            history += "\n" + user + "\n"
            history += recorder.stream(client, history, args.turn_tokens, banned)

    started = time.perf_counter()
    with ThreadPoolExecutor(args.conversations) as pool:
        list(pool.map(conversation, range(args.conversations)))
    wall = time.perf_counter() - started
    return {
        "requests": len(recorder.ttft),
        "ttft_p50_ms": 1e3 * statistics.median(recorder.ttft),
        "ttft_p90_ms": 1e3 * statistics.quantiles(recorder.ttft, n=10)[-1],
        "output_tokens_per_s": recorder.num_output / wall,
        "wall_s": wall,
    }


def compare_with_llamacpp(args) -> list[dict]:
    import torch
    from llamacpp_build import location_for
    from llamacpp_server import llamacpp_server

    from engines.model.source import resolve_model
    from engines.model.tokenizer import load_tokenizer
    from tests.support.processes import free_port, running

    build = location_for("native")
    if not build.is_built:  # compiling takes most of an hour on 2 cores: never as a side effect
        print(f"(a, text over HTTP) skipped: llama.cpp is not built in {build.directory}; "
              "run bench/llamacpp_build.py first", flush=True)  # fmt: skip
        return []
    source = resolve_model("smollm2-135m-instruct")
    info = load_tokenizer(source)
    banned = {str(token): -100.0 for token in sorted(info.eos_token_ids)}
    n_ctx = args.system_tokens + 2 * args.turns * args.turn_tokens + 512  # words re-tokenized may run over
    port, http_port = free_port(), free_port()
    flags = ["serve", "--port", str(port), "--http-port", str(http_port), "--max-model-len", str(args.max_model_len)]
    with running(flags, port, timeout=300):
        dpgate = run_conversations(f"http://127.0.0.1:{http_port}", args, info.tokenizer, banned)
    dpgate["server"] = "dpgate serve (HTTP)"
    report(dpgate)
    log = Path(tempfile.gettempdir()) / f"llamacpp-server-{os.getpid()}.log"
    threads = torch.get_num_threads()
    with llamacpp_server(build.directory, source.path, free_port(), threads, n_ctx, log) as url:
        llamacpp = run_conversations(url, args, info.tokenizer, banned)
    llamacpp["server"] = "llama.cpp server (llama-cpp-python)"
    report(llamacpp)
    ttft = dpgate["ttft_p50_ms"] / llamacpp["ttft_p50_ms"]
    rate = dpgate["output_tokens_per_s"] / llamacpp["output_tokens_per_s"]
    print(f"(a, text over HTTP) dpgate / llama.cpp: TTFT p50 {ttft:.2f}x, output throughput {rate:.2f}x", flush=True)
    return [dpgate, llamacpp]


def report(result: dict) -> None:
    print(
        f"(a, text over HTTP) {result['server']:<36}{result['requests']:>5} reqs"
        f"  TTFT p50 {result['ttft_p50_ms']:>8.0f} ms  p90 {result['ttft_p90_ms']:>8.0f} ms"
        f"  {result['output_tokens_per_s']:>7.1f} out tok/s",
        flush=True,
    )
