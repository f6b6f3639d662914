"""Bad flags at start-up: exit status 2 and one sentence naming the flag, never a traceback."""

from __future__ import annotations

import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.gguf_files import cut_short, write_one_tensor_gguf
from tests.support.processes import dpgate_command, free_port, pinned_to_one_cpu

pytestmark = pytest.mark.e2e  # every test here starts a process


def run_engine(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(dpgate_command("engine", *flags), capture_output=True, text=True, timeout=60)


def run_engines(flag_lists: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """run_engine for each list of flags, four processes at a time: most of each one's time is
    importing, and the cases are independent."""
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda flags: run_engine(*flags), flag_lists))


def bad_flag_cases(tmp_path):
    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"PK\x03\x04 definitely not a gguf file")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00")
    cut_data = tmp_path / "cut-data.gguf"
    write_one_tensor_gguf(cut_data)
    cut_short(cut_data, 100)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    return [
        (["--port", "0"], "--port 0 must be in [1, 65535]"),
        (["--port", "70000"], "--port 70000 must be in [1, 65535]"),
        (["--port", "5000", "--metrics-port", "5000"], "--metrics-port 5000 must differ from --port"),
        (["--dtype", "int3"], "--dtype int3 must be one of auto, bfloat16, float16, float32"),
        (["--dtype", "float16"], "--dtype float16 is not supported by the batch-invariant kernels"),
        (["--max-model-len", "1"], "--max-model-len 1 must be >= 2"),
        (["--data-parallel-size", "0"], "--data-parallel-size 0 must be >= 1"),
        (
            ["--step-tokens-after-a-finished-prompt", "0"],
            "--step-tokens-after-a-finished-prompt 0 must be >= 1",
        ),
        (
            ["--data-parallel-rank", "2", "--data-parallel-size", "2"],
            "--data-parallel-rank 2 must be in [0, 1] for --data-parallel-size 2",
        ),
        (
            ["--model", str(tmp_path / "missing.gguf")],
            f"--model {tmp_path / 'missing.gguf'}: no such file or directory, and not a known model name",
        ),
        (["--model", str(not_gguf)], f"--model {not_gguf}: the file is not a GGUF file"),
        (["--model", str(truncated)], "is not a readable GGUF file"),
        (["--model", str(cut_data)], f"{cut_data} is truncated: tensor weight needs bytes up to"),
        (["--model", str(empty_dir)], f"--model {empty_dir}: the directory has no config.json"),
        (
            ["--tensor-parallel-size", "3", "--decode-context-parallel-size", "2"],
            "--decode-context-parallel-size 2 must be >= 1 and divide --tensor-parallel-size 3",
        ),
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size 0 must be >= 1"),
        (["--dcp-kv-interleave", "3"], "--dcp-kv-interleave 3 must be >= 1 and divide --block-size 16"),
        (["--tensor-parallel-size", "512"], "--tensor-parallel-size 512 is more than the"),
        (
            ["--tensor-parallel-size", "2", "--decode-context-parallel-size", "2", "--no-batch-invariant"],
            "--decode-context-parallel-size above 1 needs the batch-invariant kernels",
        ),
        (
            ["--quantization", "int-dot", "--no-batch-invariant"],
            "--quantization int-dot needs the batch-invariant kernels; drop --no-batch-invariant",
        ),
        (
            ["--kernel-isa", "avx9"],
            "--kernel-isa avx9 must be one of auto, avx512_vnni, avx512, avx2, scalar",
        ),
        (["--kernel-isa", "avx2", "--no-batch-invariant"], "--kernel-isa names a batch-invariant kernel"),
        (["--worker-step-timeout", "0"], "--worker-step-timeout 0.0 must be > 0"),
        (
            ["--chat-template", str(tmp_path / "missing.jinja")],
            f"--chat-template {tmp_path / 'missing.jinja'} cannot be read (No such file or directory)",
        ),
        (["--reasoning-parser", "deepseek"], "--reasoning-parser deepseek must be one of none, think"),
        (["--tool-call-parser", "mistral"], "--tool-call-parser mistral must be one of none, hermes"),
        (["--reasoning-markers", "<think>"], "--reasoning-markers <think> must be START,END"),
    ]


def model_bad_flag_cases(model_dir):
    """Rules that need the model's shape: the tiny Llama has 4 query heads and 2 KV heads."""
    model = ["--model", str(model_dir), "--allow-oversubscribe"]
    return [
        ([*model, "--tensor-parallel-size", "3"], "--tensor-parallel-size 3 must divide the model's 4 query heads"),
        (
            [*model, "--tensor-parallel-size", "2", "--decode-context-parallel-size", "2"],
            "--decode-context-parallel-size 2 must be at most --tensor-parallel-size / KV heads = 2/2",
        ),
        ([*model, "--tensor-parallel-size", "8", "--decode-context-parallel-size", "1"],
         "--tensor-parallel-size 8 must divide the model's 4 query heads"),
    ]


def test_every_bad_flag_exits_2_with_one_sentence(tmp_path):
    cases = bad_flag_cases(tmp_path)
    for (flags, message), result in zip(cases, run_engines([flags for flags, _ in cases]), strict=True):
        assert result.returncode == 2, (flags, result.stderr)
        assert message in result.stderr, (flags, result.stderr)
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_parallel_flags_the_model_cannot_take_exit_2_with_one_sentence(tiny_model_dir):
    cases = model_bad_flag_cases(tiny_model_dir)
    results = run_engines([["--port", str(free_port()), *flags] for flags, _ in cases])
    for (flags, message), result in zip(cases, results, strict=True):
        assert result.returncode == 2, (flags, result.stderr)
        assert message in result.stderr, (flags, result.stderr)
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_argparse_errors_also_exit_2():
    result = run_engine("--port", "not-a-number")
    assert result.returncode == 2 and "--port" in result.stderr


def test_a_port_in_use_exits_2_naming_the_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_engine("--port", str(port))
    assert result.returncode == 2
    assert f"--port {port}: cannot bind" in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr


def test_max_model_len_beyond_the_models_context_exits_2(tiny_model_dir):
    result = run_engine("--port", str(free_port()), "--model", str(tiny_model_dir), "--max-model-len", "5000")
    assert result.returncode == 2
    assert "--max-model-len 5000 must be <= the model's context of 1024" in result.stderr.splitlines()[-1]


def test_more_threads_than_the_engine_may_run_on_is_warned_about(tiny_model_dir):
    """Pinned to one CPU, --num-threads 2 would make every step's threads wait on each other; the
    too-long --max-model-len ends the start right after the warning."""
    result = subprocess.run(
        dpgate_command("engine", "--port", str(free_port()), "--model", str(tiny_model_dir),
                       "--num-threads", "2", "--max-model-len", "5000"),
        capture_output=True, text=True, timeout=60, preexec_fn=pinned_to_one_cpu,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--num-threads 2 is more than the 1 CPUs this engine may run on" in result.stderr


@pytest.mark.parametrize("flags", [["--help"], []])
def test_the_dpgate_command_lists_its_subcommands(flags):
    result = subprocess.run(dpgate_command(*flags), capture_output=True, text=True, timeout=30)
    assert "engine" in result.stdout + result.stderr and "generate" in result.stdout + result.stderr
