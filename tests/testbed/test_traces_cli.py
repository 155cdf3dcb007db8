"""``opus-testbed import kineto`` and ``opus-testbed workload compare`` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "workloads" / "data" / "kineto-fsdp2-pp2"
TRACES = [str(REAL / f"rank{r}.json.gz") for r in range(4)]
GENERATED = ROOT / "examples" / "torch" / "llama-tiny-generated.yaml"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("import") / "tiny"
    assert main(["import", "kineto", *TRACES, "--out", str(out), "--name", "tiny-llama",
                 "--json"]) == 0
    return out


def test_import_prints_what_it_imported(imported: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    assert main(["import", "kineto", *TRACES, "--out", str(imported.parent / "again"),
                 "--gpus-per-server", "2"]) == 0
    out = capsys.readouterr().out
    assert "imported 4 traces (layout L3), ProfilerStep 1: 12 collective calls per rank" in out
    assert "groups: pp 2, fsdp 2" in out
    assert "cluster: {servers: 2, gpus_per_server: 2}" in (
        imported.parent / "again" / "experiment.yaml").read_text()


def test_import_writes_a_schedule_and_an_experiment_that_runs_on_the_sim_backend(
        imported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sorted(p.name for p in imported.iterdir()) == ["experiment.yaml", "workload.json"]
    text = (imported / "experiment.yaml").read_text()
    assert "workload: {schedule: workload.json}" in text and 'name: "tiny-llama"' in text
    capsys.readouterr()
    code = main(["run", str(imported / "experiment.yaml"), "--backend", "sim", "--json",
                 "--out", str(tmp_path / "run")])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["all_iterations_completed"] is True
    assert summary["iterations_completed"] == 3 and len(summary["iteration_times_s"]) == 2
    assert summary["calls_delivered"] == summary["calls"] == 3 * 4 * 12
    assert summary["reconfigurations"] > 0


def test_bad_traces_exit_2_naming_file_and_event_and_leave_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "rank3.json.gz"
    broken.write_bytes(b"{")
    out = tmp_path / "out"
    assert main(["import", "kineto", str(broken), *TRACES[:3], "--out", str(out)]) == 2
    assert "rank3.json.gz: not a Chrome trace" in capsys.readouterr().err
    assert not out.exists()


def test_an_empty_trace_exits_2_naming_the_cause(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A profiler with schedule= exported after its with block writes a trace without events:
    refused, exit 2, no traceback (it was an uncaught ValueError)."""
    empty = tmp_path / "rank0.json"
    empty.write_text(json.dumps({"traceEvents": [], "distributedInfo": {
        "rank": 0, "world_size": 1, "pg_config": []}}))
    assert main(["import", "kineto", str(empty), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "rank0.json: empty: no complete" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_import_refuses_a_non_empty_output_directory_and_bad_options(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["import", "kineto", *TRACES, "--out", str(tmp_path)]) == 2
    assert "not an empty directory; nothing was written" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    with pytest.raises(SystemExit) as bad:
        main(["import", "kineto", *TRACES, "--out", str(tmp_path / "o"), "--axis", "mesh_pp"])
    assert bad.value.code == 2
    assert "--axis: wants DESC=AXIS, got 'mesh_pp'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_compare_generated_and_imported(imported: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", "compare", str(imported / "workload.json"),
                 str(imported / "experiment.yaml")]) == 0
    out = capsys.readouterr().out
    assert "ranks 0,1,2,3" not in out  # stages differ, so ranks are grouped per stage
    assert out.count("differences: none") == 2 and out.rstrip().endswith("schedules agree")
    assert main(["workload", "compare", str(GENERATED), str(imported / "workload.json"),
                 "--json", "--rank", "0"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert list(rep["ranks"]) == ["0"] and rep["equal"] is False
    diffs = rep["ranks"]["0"]["differences"]
    assert any(d["change"] == "only_a" and d["phase"] == "pp allreduce" for d in diffs)


def test_compare_refuses_bad_input_with_exit_2(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", "compare", str(GENERATED), str(ROOT / "examples" / "demo.yaml")
                 ]) == 2
    assert "the schedules have 4 and 16 ranks" in capsys.readouterr().err
    assert main(["workload", "compare", str(GENERATED), str(tmp_path / "none.json")]) == 2
    assert "none.json: cannot read it" in capsys.readouterr().err
    assert main(["workload", "compare", str(GENERATED), str(GENERATED), "--rank", "9"]) == 2
    assert "rank 9 is not in 0..3" in capsys.readouterr().err


def test_workload_config_still_works_and_reads_schedule_files(
        imported: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", str(GENERATED), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "llama-tiny"
    assert main(["workload", str(imported / "experiment.yaml"), "--rank", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["model"] == "kineto schedule" and rep["params"] is None
    assert rep["totals"]["pp/recv"]["calls"] == 2


def test_help_of_the_new_commands(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["import", "kineto", "--help"], ["workload", "compare", "--help"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--gpus-per-server" in out and "PP<->DP boundaries" in out
