"""llama.cpp's server as bench/prefix_cache.py's peer: llama-cpp-python's OpenAI-compatible server
(`python -m llama_cpp.server`) on the build bench/llamacpp_build.py makes, with its prompt cache on.

The server's own dependencies (FastAPI, uvicorn, sse-starlette, starlette-context,
pydantic-settings, PyYAML) are installed once from PyPI into a directory beside the build, never into
dpgate's environment; the server runs with that directory and the build first on PYTHONPATH.

Its prompt cache: the model keeps the tokens it evaluated last and reuses their longest common
prefix with the next prompt, and `--cache true` adds a RAM cache of saved states keyed by prompt
prefix (2 GiB by default), so a conversation's next turn can restore its history instead of
recomputing it. The server serves one request at a time (a lock around the model): requests sent
together queue.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from tests.support.health import poll_until_http_ok
from tests.support.processes import stop_process

SERVER_DEPENDENCIES = (
    "fastapi==0.142.2",
    "uvicorn==0.54.0",
    "sse-starlette==3.5.0",
    "starlette-context==0.3.6",
    "pydantic-settings==2.15.0",
    "PyYAML",
)


def dependencies_dir(build_directory: Path) -> Path:
    return build_directory.with_name(build_directory.name + "-server-deps")


def install_dependencies(build_directory: Path, log=print) -> Path:
    """The server's pure-Python dependencies beside the build (pip --target, once)."""
    target = dependencies_dir(build_directory)
    if (target / "fastapi").is_dir() and (target / "starlette_context").is_dir():
        return target
    scratch = target.with_name(target.name + f".partial-{os.getpid()}")
    log(f"installing llama-cpp-python's server dependencies into {target}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(scratch), *SERVER_DEPENDENCIES],
                   check=True)  # fmt: skip
    scratch.rename(target)
    return target


@contextmanager
def llamacpp_server(build_directory: Path, gguf: Path, port: int, threads: int, n_ctx: int, log_path: Path):
    """Yields the server's base URL (http://127.0.0.1:PORT); stops the server (by its pid) after."""
    deps = install_dependencies(build_directory)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(build_directory), str(deps)]))
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(n_ctx), "--n_threads", str(threads), "--n_threads_batch", str(threads), "--cache", "true",
        "--verbose", "false",
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        poll_until_http_ok(f"{url}/v1/models", process, "llama.cpp's server", timeout=300)
        yield url
    finally:
        stop_process(process, timeout=30)
