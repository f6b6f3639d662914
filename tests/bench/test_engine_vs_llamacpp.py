"""bench/engine_vs_llamacpp.py and its llama.cpp find-or-build: the cache naming, the all-or-nothing
build, the rows and JSON it writes, and (only where llama.cpp is already built in the cache, never
in CI) one small real run of both peers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import engine_vs_llamacpp as bench
from bench import llamacpp_build

ROOT = Path(__file__).resolve().parents[2]
AVX512_FLAGS = frozenset({"avx2", "fma", "avx512f", "avx512bw"})
AVX2_FLAGS = frozenset({"avx2", "fma"})


def fake_build(directory: Path) -> None:
    """What a successful pip install --target leaves: the package, its library, its dependency."""
    (directory / "llama_cpp" / "lib").mkdir(parents=True)
    (directory / "llama_cpp" / "__init__.py").write_text("__version__ = 'test'\n")
    (directory / "llama_cpp" / "lib" / "libllama.so").write_bytes(b"")
    (directory / "diskcache").mkdir()
    (directory / "diskcache" / "__init__.py").write_text("")


def target_of(command: list[str]) -> Path:
    return Path(command[command.index("--target") + 1])


def test_a_build_is_named_by_version_isa_and_cpu_flags(tmp_path):
    native = llamacpp_build.build_location(tmp_path, AVX512_FLAGS, "native")
    assert native.directory.parent == tmp_path / "llamacpp"
    assert native.directory.name.startswith(f"{llamacpp_build.LLAMA_CPP_PYTHON_VERSION}-native-")
    assert native == llamacpp_build.build_location(tmp_path, AVX512_FLAGS, "native")
    assert native.directory != llamacpp_build.build_location(tmp_path, AVX2_FLAGS, "native").directory
    assert native.directory != llamacpp_build.build_location(tmp_path, AVX512_FLAGS, "avx2").directory


def test_the_avx2_build_turns_avx512_off_and_native_off():
    args = llamacpp_build.cmake_args("avx2")
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX512=OFF" in args and "-DGGML_AVX2=ON" in args
    assert "-DGGML_NATIVE=ON" in llamacpp_build.cmake_args("native")
    with pytest.raises(ValueError, match="isa must be one of native, avx2"):
        llamacpp_build.cmake_args("avx512")


def test_a_build_counts_only_with_package_library_and_dependency(tmp_path):
    location = llamacpp_build.build_location(tmp_path, AVX2_FLAGS)
    assert not location.is_built
    fake_build(location.directory)
    assert location.is_built
    (location.directory / "diskcache" / "__init__.py").unlink()
    assert not location.is_built


def test_a_successful_build_appears_whole_with_native_cmake_args(tmp_path):
    location = llamacpp_build.build_location(tmp_path, AVX512_FLAGS, "avx2")
    calls = []

    def run(command, env, check):
        calls.append((command, env))
        fake_build(target_of(command))

    llamacpp_build.build(location, jobs=3, log=lambda text: None, run=run)
    assert location.is_built
    ((command, env),) = calls
    assert f"llama-cpp-python=={location.version}" in command and "--no-deps" in command
    assert env["CMAKE_ARGS"] == " ".join(llamacpp_build.cmake_args("avx2"))
    assert env["CMAKE_BUILD_PARALLEL_LEVEL"] == "3"
    assert [p.name for p in location.directory.parent.iterdir()] == [location.directory.name]


@pytest.mark.parametrize("outcome", ["fails", "writes nothing"])
def test_a_failed_build_leaves_nothing_behind(tmp_path, outcome):
    location = llamacpp_build.build_location(tmp_path, AVX2_FLAGS)

    def run(command, env, check):
        target_of(command).mkdir(parents=True, exist_ok=True)
        if outcome == "fails":
            raise subprocess.CalledProcessError(1, command)

    error = subprocess.CalledProcessError if outcome == "fails" else RuntimeError
    with pytest.raises(error):
        llamacpp_build.build(location, log=lambda text: None, run=run)
    assert list(location.directory.parent.iterdir()) == []


def test_find_or_build_reuses_the_cached_build(tmp_path, monkeypatch):
    location = llamacpp_build.location_for("native", tmp_path)
    fake_build(location.directory)
    monkeypatch.setattr(llamacpp_build, "build", lambda *args, **kwargs: pytest.fail("rebuilt a cached build"))
    assert llamacpp_build.find_or_build("native", tmp_path) == location


def test_rows_carry_medians_and_ratios_and_the_json_has_its_schema():
    sizes = bench.Sizes(decode_tokens=8, prompt_tokens=32, output_tokens=4, concurrency=2)
    keys = [key for _, key in sizes.figures()]
    samples = {
        "dpgate": {key: [10.0, 30.0, 20.0] for key in keys},
        "llama.cpp": {key: [40.0, 40.0, 10.0] for key in keys},
    }
    rows = bench.table_rows(sizes, samples)
    assert [row["figure"] for row in rows] == [
        "batch-1 decode",
        "prefill, one sequence (32 tokens)",
        "2 x 32+4: decode rate",
        "2 x 32+4: prefill rate",
        "2 x 32+4: end-to-end output",
    ]
    assert all(row["dpgate"] == 20.0 and row["llama.cpp"] == 40.0 and row["ratio"] == 0.5 for row in rows)
    written = json.loads(json.dumps(bench.report("CPU: test", rows)))
    assert written["benchmark"] == "engine_vs_llamacpp" and written["machine"] == "CPU: test"
    assert set(written["results"]["rows"][0]) == {"figure", "dpgate", "llama.cpp", "ratio", "unit"}
    assert "0.50x" in bench.format_table(rows)


def test_a_batched_result_is_flattened_by_figure_key():
    task = {"task": "batched"}
    assert bench.flatten(task, {"decode": 1.0, "prefill": 2.0}) == {"batched.decode": 1.0, "batched.prefill": 2.0}
    assert bench.flatten({"task": "decode"}, 3.0) == {"decode": 3.0}


def test_rounds_feed_both_peers_new_prompts_of_the_asked_sizes():
    sizes = bench.Sizes(decode_tokens=8, prompt_tokens=32, output_tokens=4, concurrency=3)
    first, second = bench.tasks(sizes, seed=1), bench.tasks(sizes, seed=2)
    assert [t["task"] for t in first] == ["decode", "prefill", "batched"]
    assert len(first[2]["prompts"]) == 3 and {len(p) for p in first[2]["prompts"]} == {32}
    assert first[2]["prompts"] != second[2]["prompts"] and first == bench.tasks(sizes, seed=1)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--output-tokens", "1"], "--output-tokens must be >= 2"),
        (["--isa", "avx512"], "invalid choice: 'avx512'"),
        (["--clock", "cpu", "--threads", "1"], "--clock cpu times the in-process core only: add --dpgate core"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(flags, message, capsys):
    with pytest.raises(SystemExit) as exited:
        bench.parse_args(flags)
    assert exited.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.skipif(
    not llamacpp_build.location_for().is_built, reason="llama.cpp is not built in the cache (no build in CI)"
)
def test_a_small_real_run_measures_both_peers(tmp_path):
    out = tmp_path / "rows.json"
    small = ["--decode-tokens", "4", "--prompt-tokens", "16", "--output-tokens", "3", "--concurrency", "2"]
    command = [sys.executable, str(ROOT / "bench" / "engine_vs_llamacpp.py"), *small, "--repeats", "1"]
    result = subprocess.run([*command, "--no-build", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads(out.read_text())
    assert written["machine"].startswith("CPU: ")
    rows = written["results"]["rows"]
    assert len(rows) == 5 and all(row["dpgate"] > 0 and row["llama.cpp"] > 0 for row in rows)
    assert "batch-1 decode" in result.stdout


def test_the_no_amx_build_turns_on_each_extension_the_cpu_has_and_amx_off():
    args = llamacpp_build.cmake_args("no-amx", frozenset({"avx", "avx2", "fma", "avx512f", "avx512_vnni", "amx_tile"}))
    assert "-DGGML_NATIVE=OFF" in args
    assert {"-DGGML_AVX2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=OFF"} <= set(args)
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(args)
    # the flags name the build: the same ISA on another CPU is another directory
    assert llamacpp_build.flags_hash(frozenset({"avx2"}), "no-amx") != llamacpp_build.flags_hash(
        frozenset({"avx2", "avx512f"}), "no-amx"
    )


@pytest.mark.parametrize(
    ("returncode", "stdout", "expected"),
    [
        (0, '{"describe": "x"}\n{"value": 812.5}\n', None),
        (-4, '{"describe": "x"}\n', "died by SIGILL"),
        (1, '{"error": "no library"}\n', 'failed (exit status 1): {"error": "no library"}'),
    ],
)
def test_the_prompt_check_names_how_a_build_died(returncode, stdout, expected, tmp_path):
    seen = {}

    def run(command, **kwargs):
        seen["command"], seen["input"] = command, kwargs["input"]
        return subprocess.CompletedProcess(command, returncode, stdout, "")

    assert bench.prompt_check(tmp_path, 2, run=run) == expected
    assert seen["command"][seen["command"].index("--llamacpp-dir") + 1] == str(tmp_path)
    task = json.loads(seen["input"])
    assert task["task"] == "prefill" and len(task["prompt"]) == 64
