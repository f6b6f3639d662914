"""bench/report.py: docs/performance.md's generated section from recorded benchmark JSON (the ratio
table, the CPU, the PNGs), the hand-written sections kept, the CLI's errors, and one real quick
benchmark run through the report."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import envoy_peer
import pytest
import report
import report_plots
import report_render
from PIL import Image

from dpgate.cache_dir import dpgate_cache_dir

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
CPU = "AMD EPYC (AVX2, FMA, AVX-512, AVX512-BF16), 2 cores"  # what the fixtures were recorded on
HAND_WRITTEN = "# Performance\n\nWhy the numbers are what they are.\n\n## Gateway overhead\n\nHistory kept here.\n"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def render(tmp_path: Path, results: Path = FIXTURES, document: str = HAND_WRITTEN) -> str:
    out = tmp_path / "docs"
    out.mkdir(exist_ok=True)
    (out / "performance.md").write_text(document)
    assert report.main(["--from-json", str(results), "--out", str(out)]) == 0
    return (out / "performance.md").read_text()


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The page rendered once from every fixture (the tests that only read it share it)."""
    tmp_path = tmp_path_factory.mktemp("report")
    return render(tmp_path), tmp_path / "docs"


def generated(text: str) -> str:
    return text[text.index(report_render.BEGIN) : text.index(report_render.END)]


def table_rows(text: str) -> list[list[str]]:
    section = generated(text).split("| figure | dpgate | peer | ratio | CPU |", 1)[1].split("\n\n", 1)[0]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in section.strip().splitlines()[1:]]


def test_the_ratio_table_comes_first_with_dpgate_over_each_peer_and_the_cpu(rendered) -> None:
    text, _ = rendered
    section = generated(text)
    assert section.index("| figure | dpgate | peer | ratio | CPU |") < section.index("### Plots")
    listed = table_rows(text)
    rows = {row[0]: row for row in listed}
    throughput = {s["role"]: s for s in fixture("throughput")["results"]["systems"]}
    expected = throughput["served"]["output_tokens_per_s"] / throughput["transformers-static"]["output_tokens_per_s"]
    row = next(row for figure, row in rows.items() if figure.startswith("serving throughput") and "16 in" in figure)
    assert row[3].startswith(f"**{expected:.2f}x** (higher is better)")
    grammar = fixture("grammar_overhead")["results"]["conditions"]
    expected = grammar["json schema"]["tokens_per_s"] / grammar["unconstrained"]["tokens_per_s"]
    row = next(row for figure, row in rows.items() if "JSON schema" in figure)
    assert row[3].startswith(f"**{expected:.2f}x**")
    startup = next(row for figure, row in rows.items() if figure.startswith("time from launch"))
    assert "(lower is better)" in startup[3]
    for name in ("throughput", "engine_vs_transformers", "startup", "gateway_overhead", "http_overhead",
                 "grammar_overhead", "dcp_scaling", "engine_vs_llamacpp", "prefix_cache", "routing"):  # fmt: skip
        assert report_render.ROWS[name](fixture(name)), name
    assert len(listed) == sum(len(report_render.ROWS[name](fixture(name))) for name in report_render.ROWS)
    # engine_vs_llamacpp stores describe_machine()'s line, which counts torch threads, not cores
    assert all(row[4] in (CPU, CPU.removesuffix(", 2 cores")) for row in listed)


def test_every_plot_is_a_real_png_named_in_the_page_with_its_cpu(rendered) -> None:
    text, out = rendered
    figures = out / "performance"
    pngs = sorted(figures.glob("*.png"))
    assert [p.name for p in pngs] == sorted(file_name for _, file_name, _, _ in report_plots.PLOTS)
    for png in pngs:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        width, height = struct.unpack(">II", data[16:24])
        assert width >= 600 and height >= 400 and len(data) > 15_000, png.name
        with Image.open(png) as image:
            image.verify()  # decodes every chunk and checks the CRCs
        link = f"(performance/{png.name})"
        assert link in text
        caption = text.split(link, 1)[1].split("\n\n", 2)[1]
        assert f"CPU: {CPU}" in caption, png.name


def test_the_hand_written_sections_are_kept_and_a_second_render_changes_nothing(tmp_path: Path) -> None:
    first = render(tmp_path)
    assert first.startswith("# Performance\n\n" + report_render.BEGIN)
    assert first.endswith(
        report_render.END + "\n\nWhy the numbers are what they are.\n\n## Gateway overhead\n\nHistory kept here.\n"
    )
    second = render(tmp_path, document=first.replace("History kept here.", "History edited by hand."))
    assert second == first.replace("History kept here.", "History edited by hand.")
    with pytest.raises(ValueError, match="only one of the markers"):
        report_render.render_into(f"# P\n{report_render.BEGIN}\n", {}, {}, tmp_path, report.BENCHMARKS)


def test_a_missing_benchmark_and_a_failed_one_each_get_a_line(tmp_path: Path, monkeypatch) -> None:
    results = tmp_path / "results"
    shutil.copytree(FIXTURES, results)
    (results / "engine_vs_llamacpp.json").unlink()
    (results / "grammar_overhead.json").unlink()
    runs = json.loads((results / "runs.json").read_text())
    runs["grammar_overhead"] = {"command": ["python", "bench/grammar_overhead.py"], "wall_s": 3.0, "exit": 1,
                                "quick": False, "load_before": 0.5, "load_after": 0.6,
                                "error": "RuntimeError: no compiler"}  # fmt: skip
    (results / "runs.json").write_text(json.dumps(runs))
    bench = tmp_path / "bench"
    bench.mkdir()
    for name in report.BY_NAME:
        if name != "engine_vs_llamacpp":
            (bench / f"{name}.py").touch()
    monkeypatch.setattr(report, "BENCH", bench)
    section = generated(render(tmp_path, results))
    assert "`bench/engine_vs_llamacpp.py` is not in this checkout: skipped." in section
    assert "`bench/grammar_overhead.py` failed (exit 1): `RuntimeError: no compiler`" in section
    assert "grammar_overhead.png" not in section and "(llama.cpp)" not in section


def test_llamacpp_rows_get_the_same_table_and_their_own_section(rendered) -> None:
    section = generated(rendered[0])
    own = section.split("### dpgate against llama.cpp on the same GGUF", 1)[1].split("###", 1)[0]
    for row in fixture("engine_vs_llamacpp")["results"]["rows"]:
        assert f"| {row['figure']} |" in own
        assert f"**{row['dpgate'] / row['llama.cpp']:.2f}x**" in own


def test_every_benchmark_under_bench_is_run_by_the_report() -> None:
    scripts = {path.stem for path in (ROOT / "bench").glob("*.py")}
    unknown = scripts - report.HELPERS - set(report.BY_NAME) - set(report.NOT_RUN)
    assert not unknown, f"register {sorted(unknown)} in bench/report.py: BENCHMARKS, HELPERS or NOT_RUN"
    assert {b.name for b in report.BENCHMARKS if not b.optional} <= scripts


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "nope"], "--only nope: not a benchmark of the report"),
        (["--from-json", "/nonexistent-dir"], "--from-json /nonexistent-dir: not a directory"),
        (["--from-json", ".", "--quick"], "--from-json renders saved results"),
        (["--timeout", "0"], "--timeout must be a positive number"),
    ],
)
def test_bad_flags_exit_2_with_one_sentence(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        report.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.e2e
def test_a_quick_real_run_of_the_gateway_bench_through_the_report(tmp_path: Path) -> None:
    out = tmp_path / "docs"
    command = [
        sys.executable,
        str(ROOT / "bench/report.py"),
        "--quick",
        "--only",
        "gateway_overhead",
        "--out",
        str(out),
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "one after another" in result.stdout and "all benchmarks:" in result.stdout
    record = json.loads((out / "performance/results/gateway_overhead.json").read_text())
    assert record["benchmark"] == "gateway_overhead" and record["command"][0] == "gateway_overhead.py"
    assert record["machine"]["cores"] >= 1 and record["machine"]["cpu"]
    roles = [target["role"] for target in record["results"]["targets"]]
    # --quick never installs Envoy: it runs beside the others only where a full run installed it
    with_envoy = envoy_peer.installed(dpgate_cache_dir())
    assert roles == ["direct", "peer", *(["envoy"] if with_envoy else []), "dpgate"]
    text = (out / "performance.md").read_text()
    assert "Smoke test (`bench/report.py --quick`)" in text and "unary call, added p50 latency" in text
    assert (out / "performance/gateway_added_latency.png").stat().st_size > 15_000
    runs = json.loads((out / "performance/results/runs.json").read_text())
    assert runs["gateway_overhead"]["exit"] == 0 and runs["gateway_overhead"]["quick"] is True


@pytest.mark.e2e
def test_the_gateway_bench_runs_another_checkouts_gateway_in_the_same_rounds(tmp_path: Path) -> None:
    """--baseline: the gateway of another checkout (here this one) is one more target, compared row by row."""
    out = tmp_path / "overhead.json"
    sizes = ["--no-envoy", "--repeats", "1", "--calls", "20", "--duration", "0.3", "--concurrency", "4"]
    bench = str(ROOT / "bench/gateway_overhead.py")
    command = [sys.executable, bench, *sizes, "--baseline", str(ROOT), "--json", str(out)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    targets = json.loads(out.read_text())["results"]["targets"]
    assert [target["role"] for target in targets] == ["direct", "peer", "dpgate", "baseline"]
    baseline_name = targets[-1]["name"]
    assert baseline_name.startswith("dpgate gateway at ")
    assert f"dpgate against {baseline_name} (medians)" in result.stdout
    assert "proxy CPU per stream message (us)" in result.stdout.split(baseline_name)[-1]
    # dpgate's own added-latency histogram is read over the unary calls at c=1, for both checkouts.
    for target in targets[2:]:
        [unary] = [s for s in target["scenarios"] if s["scenario"] == "unary c=1"]
        assert 0 < unary["own_added_p50_ms"] <= unary["own_added_p99_ms"] < 1000
    assert "its own histogram (dpgate_gateway_added_latency_seconds): added p50" in result.stdout


@pytest.mark.e2e
def test_the_baseline_gateway_runs_the_baseline_checkouts_code(tmp_path: Path) -> None:
    """A copy of this checkout whose gateway names its added-latency histogram differently: the
    bench, run from this checkout, finds no such histogram on the baseline (it once ran its own code)."""
    baseline = tmp_path / "before"
    for package in ("dpgate", "gateway", "engines"):
        shutil.copytree(ROOT / package, baseline / package, ignore=shutil.ignore_patterns("__pycache__"))
    metrics = baseline / "gateway" / "metrics.py"
    metrics.write_text(metrics.read_text().replace("dpgate_gateway_added_latency_seconds", "dpgate_renamed_seconds"))
    out = tmp_path / "overhead.json"
    sizes = ["--no-envoy", "--repeats", "1", "--calls", "20", "--duration", "0.3", "--concurrency", "4"]
    command = [sys.executable, str(ROOT / "bench/gateway_overhead.py"), *sizes, "--baseline", str(baseline)]
    result = subprocess.run([*command, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    ours, theirs = json.loads(out.read_text())["results"]["targets"][2:]
    assert [ours["role"], theirs["role"]] == ["dpgate", "baseline"]
    own = {target["role"]: target["scenarios"][0]["own_added_p50_ms"] for target in (ours, theirs)}
    assert own["dpgate"] is not None and own["baseline"] is None


def test_the_gateway_bench_reads_quantiles_off_a_histogram_as_prometheus_does() -> None:
    from gateway_overhead import histogram_quantile

    inf = float("inf")
    before = {0.001: 10.0, 0.002: 10.0, inf: 10.0}
    after = {0.001: 60.0, 0.002: 110.0, inf: 110.0}  # 50 calls under 1 ms, 50 between 1 and 2 ms
    assert histogram_quantile(0.5, before, after) == pytest.approx(0.001)
    assert histogram_quantile(0.99, before, after) == pytest.approx(0.001 + 0.001 * 49 / 50)
    assert histogram_quantile(0.99, after, after) is None  # nothing observed between the scrapes
    past_the_buckets = {0.001: 1.0, 0.002: 1.0, inf: 3.0}
    assert histogram_quantile(0.99, {}, past_the_buckets) == pytest.approx(0.002)
