"""`dpgate serve` passes the parallelism flags to its engines; one an engine refuses ends serve
with exit status 2 and the engine's one sentence naming the flag and the rule."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.gateway_processes import PYTHON, ROOT, free_port


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--tensor-parallel-size", "3", "--decode-context-parallel-size", "2"],
            "--decode-context-parallel-size 2 must be >= 1 and divide --tensor-parallel-size 3",
        ),
        (["--dcp-kv-interleave", "5"], "--dcp-kv-interleave 5 must be >= 1 and divide --block-size 16"),
        (["--tensor-parallel-size", "512"], "--tensor-parallel-size 512 is more than the"),
        (["--chat-template", "/nonexistent/chat.jinja"], "--chat-template /nonexistent/chat.jinja cannot be read"),
        (["--tool-call-parser", "mistral"], "--tool-call-parser mistral must be one of none, hermes"),
    ],
)
def test_serve_exits_2_when_its_engines_refuse_a_parallel_flag(flags, message):
    command = [PYTHON, "-m", "dpgate.cli", "serve", "--port", str(free_port()), "--http-port", "0", *flags]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
