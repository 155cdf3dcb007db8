"""An imported experiment runs as written: ``import`` chooses the ports per rank and the
collective algorithms the rails carry for the trace's groups, says why, and refuses (naming the
group) only what no setting carries (testbed/experiment/railfit.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from testbed.cli.main import main
from testbed.experiment.config import load_experiment
from testbed.experiment.railfit import RailFitError, fit_rails

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "workloads"))
import kineto_traces as kt  # noqa: E402

TINY = ROOT / "examples" / "tiny.yaml"


def _world_traces(tmp: Path, world: int) -> list[str]:
    """``world`` ranks, each an all-to-all then an all-reduce on the world group."""
    calls = [("all_to_all", 4096, 300.0, -1), ("all_reduce", 1024, 700.0, -1)]
    return [str(p) for p in kt.write(tmp, {r: kt.world_trace(r, world, calls)
                                           for r in range(world)})]


def test_an_all_to_all_on_8_ranks_imports_as_an_experiment_that_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "imp"
    assert main(["import", "kineto", *_world_traces(tmp_path / "t", 8), "--out",
                 str(out)]) == 0
    said = capsys.readouterr().out
    # the choice and why, printed and written beside it
    assert ("all_to_all on the dp groups (8 ranks on a rail) runs multihop (set in "
            "workload.json's algorithms): pairwise, the default, needs 7 ports per rank") in said
    assert "ocs.ports_per_rank: 2: all_reduce on the dp groups" in said
    text = (out / "experiment.yaml").read_text()
    assert yaml.safe_load(text)["ocs"]["ports_per_rank"] == 2
    assert "# all_to_all on the dp groups (8 ranks on a rail) runs multihop" in text
    schedule = json.loads((out / "workload.json").read_text())
    assert schedule["config"]["algorithms"] == [["all_to_all", "dp", "multihop"]]
    # as written, on the sim backend (before: "group dp0 needs 7 circuits at rank 0")
    assert main(["run", str(out / "experiment.yaml"), "--backend", "sim", "--json", "--out",
                 str(tmp_path / "run")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["calls_delivered"] == summary["calls"] == 3 * 8 * 2


def test_an_all_to_all_that_fits_keeps_its_default_algorithm(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "imp"
    assert main(["import", "kineto", *_world_traces(tmp_path / "t", 3), "--out", str(out),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ports_per_rank"] == 2 and report["algorithms"] == []
    assert any("all_to_all on the dp groups (3 ranks on a rail) runs pairwise" in n
               for n in report["notes"])


def test_groups_of_two_need_one_port_and_no_note() -> None:
    schedule = load_experiment(TINY).schedule()  # fsdp and pp pairs on one rail
    fit = fit_rails(schedule)
    assert fit.ports_per_rank == 1 and fit.notes == () and fit.schedule is schedule


def test_what_no_setting_carries_is_refused_naming_the_group(tmp_path: Path) -> None:
    # PP 2 x FSDP 3 on 3 servers of 2 GPUs: an FSDP group's members sit on both rails
    text = TINY.read_text().replace("servers: 4\n  gpus_per_server: 1",
                                    "servers: 3\n  gpus_per_server: 2").replace(
        "fsdp: 2, pp: 2", "fsdp: 3, pp: 2")
    (tmp_path / "x.yaml").write_text(text)
    with pytest.raises(RailFitError) as info:
        fit_rails(load_experiment(tmp_path / "x.yaml").schedule())
    msg = str(info.value)
    assert "no ports-per-rank or algorithm setting" in msg and "group fsdp0" in msg
    assert "across rails" in msg and "Use more ports per rank" not in msg
