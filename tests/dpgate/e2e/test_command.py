"""`dpgate e2e`'s flags: bad values end with exit 2 and one sentence naming the flag; the defaults
are the CI topology and its workloads."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpgate.cli import command_parser
from dpgate.e2e.command import _splittable, run, settings_list
from dpgate.e2e.matrix import CI_TOPOLOGY, CI_WORKLOADS, full_topologies
from dpgate.e2e.workloads import REGISTRY

SAMPLES = "tests.dpgate.e2e.sample_workloads"  # workloads a test can name: one passes, one hangs


def parse(*flags: str):
    _, parser = command_parser("e2e")
    return parser.parse_args(list(flags))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dp", "0"], "--dp 0 must be at least 1."),
        (["--tp", "1", "--dcp", "2"], "--dcp 2 must divide --tp 1."),
        (["--matrix", "full", "--dp", "2"], "--matrix chooses the topologies"),
        (["--matrix", "ci", "--gateway-port", "5000"], "name one topology: not with --matrix"),
        (["--workload-budget", "0"], "--workload-budget 0.0 must be more than 0 seconds."),
        (["--gateway-port", "70000"], "--gateway-port 70000 must be in 1..65535."),
        (["--engine-base-port", "65535", "--dp", "2"], "ports up to 65536 must lie in 1..65535"),
        (["--engine-base-port", "6000", "--dp", "2", "--gateway-port", "6001"], "lies among the engines' ports"),
        (["--model-sha256", "abc"], "--model-sha256 abc must be 64 hexadecimal digits."),
        (["--kv-cache-memory-mb", "0"], "--kv-cache-memory-mb 0 must be at least 1."),
        (["--health-interval", "0"], "--health-interval 0.0 must be more than 0 seconds."),
        (["--workload", "nonsense"], "--workload nonsense: must be one of smoke, greedy-identity"),
        (["--workload", "tests.e2e.nowhere:run"], "--workload tests.e2e.nowhere:run: cannot import module"),
        (["--workload", "tests.dpgate.e2e.sample_workloads:absent"], "has no function absent"),
    ],
)
def test_a_bad_flag_is_one_sentence_and_exit_2(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert run(parse("--run-dir", str(tmp_path), *flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpgate e2e: error: ") and message in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())  # nothing ran, no sentinel


def test_the_defaults_are_the_ci_topology_and_its_workloads(tmp_path: Path) -> None:
    [settings] = settings_list(parse(), tmp_path)
    assert settings.topology == CI_TOPOLOGY and settings.workloads == CI_WORKLOADS and settings.hosts == "local"
    assert settings.run_dir == tmp_path


def test_long_and_short_topology_flags_and_repeated_workloads(tmp_path: Path) -> None:
    args = parse("--data-parallel-size", "1", "--tp", "2", "--decode-context-parallel-size", "2", "--model",
                 "gemma3-270m", "--workload", "smoke", "--workload", f"{SAMPLES}:passes")  # fmt: skip
    [settings] = settings_list(args, tmp_path)
    assert (settings.topology.dp, settings.topology.tp, settings.topology.dcp) == (1, 2, 2)
    assert settings.topology.model == "gemma3-270m"
    assert settings.workloads == ("smoke", "tests.dpgate.e2e.sample_workloads:passes")


def test_the_full_matrix_runs_each_topology_in_its_own_directory_on_netns(tmp_path: Path) -> None:
    runs = settings_list(parse("--matrix", "full"), tmp_path)
    assert [settings.topology for settings in runs] == full_topologies()
    assert {settings.hosts for settings in runs} == {"netns"}
    assert [settings.run_dir for settings in runs] == [tmp_path / t.name for t in full_topologies()]
    assert {settings.hosts for settings in settings_list(parse("--matrix", "full", "--hosts", "local"), tmp_path)} == {
        "local"
    }


def test_a_matrix_workload_that_cannot_be_imported_stops_the_run_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(REGISTRY, "greedy-identity", "tests.e2e.nowhere:run")
    assert run(parse("--run-dir", str(tmp_path), "--matrix", "full")) == 2
    err = capsys.readouterr().err
    assert "--workload greedy-identity: cannot import module tests.e2e.nowhere" in err and "of the matrix" in err
    assert not any(tmp_path.iterdir())


def test_a_topology_the_model_cannot_split_is_a_bad_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(parse("--run-dir", str(tmp_path), "--tp", "2")) == 2  # SmolLM2-135M: 9 query heads
    err = capsys.readouterr().err
    assert "--model smollm2-135m-instruct does not split as asked" in err and "9 query heads" in err


def test_the_full_matrix_leaves_out_what_its_models_cannot_split(tmp_path: Path) -> None:
    kept, left_out = _splittable(settings_list(parse("--matrix", "full"), tmp_path))
    assert {entry["topology"] for entry in left_out} == {
        t.name for t in full_topologies() if t.model == "smollm2-135m-instruct" and t.tp == 2
    }
    assert len(kept) == 8 and {s.topology.model for s in kept} == {"smollm2-135m-instruct", "gemma3-270m"}
