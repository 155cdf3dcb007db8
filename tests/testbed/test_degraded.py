"""A figure that rests on a degraded run is marked, listed and makes its command exit 3.

Fakes stand in for the emulated runs (no root): a sim run relabelled ``degraded``, or summaries
made by hand, fed to ``run --baseline``, ``sweep``, ``ladder`` and ``bench crossval``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from testbed.cli.main import main
from testbed.experiment.config import ExperimentConfig
from testbed.metrics import degraded
from testbed.metrics.fit import fit_families
from testbed.studies import crossval, ladder, sweep
from testbed.studies import run as study_run

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.yaml"
REASONS = ["the machine's CPU was saturated (mean 97 %)", "dark periods overran"]


def _degrade(summary: dict[str, Any]) -> dict[str, Any]:
    return {**summary, "fidelity": "degraded", "fidelity_blame": "machine",
            "fidelity_reasons": list(REASONS)}


def test_one_rule_degraded_means_the_verdict_says_so() -> None:
    assert degraded.is_degraded({"fidelity": "degraded"})
    for fidelity in ("ok", "simulated", None):
        assert not degraded.is_degraded({"fidelity": fidelity})
    assert not degraded.is_degraded(None) and not degraded.is_degraded({})
    runs = [("a", {"fidelity": "degraded"}), ("b", {"fidelity": "ok"}),
            ("a", {"fidelity": "degraded"}), ("c", {"fidelity": "degraded"})]
    assert degraded.degraded_labels(runs) == ["a", "c"]
    assert degraded.as_list("a; b") == ["a", "b"] and degraded.as_list("") == []
    assert degraded.exit_status([]) == 0 and degraded.exit_status(["a"]) == 3
    assert degraded.legend([("b", {"fidelity": "ok"})]) == []
    lines = degraded.legend([("a", _degrade({})), ("b", {"fidelity": "simulated"})])
    assert lines[1] == f"  a: degraded (blamed on the machine: {'; '.join(REASONS)})"
    assert lines[-1] == "exit status 3: printed figures rest on 1 degraded run"


def _fake_run_one(degrade: Sequence[str]) -> Callable[..., dict[str, Any]]:
    """``run_one`` on the sim backend, with the runs of the modes in ``degrade`` relabelled as
    degraded emulated runs."""
    real = study_run.run_one

    def run_one(cfg: ExperimentConfig, out: Path, _backend: str, say: Any,
                _prep: Any = None) -> dict[str, Any]:
        summary = real(cfg, out, "sim", say)
        return _degrade(summary) if cfg.mode in degrade else summary
    return run_one


@pytest.mark.parametrize(("degrade", "rests_on"), [
    ((), []), (("baseline",), ["baseline"]), (("on-demand",), ["run"]),
    (("baseline", "on-demand"), ["baseline", "run"])])
def test_run_with_a_baseline_exits_3_when_either_run_is_degraded(
        degrade: tuple[str, ...], rests_on: list[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(study_run, "run_one", _fake_run_one(degrade))
    status = main(["run", str(TINY), "--mode", "on-demand", "--baseline", "--iterations", "1",
                   "--out", str(tmp_path / "r")])
    assert status == (3 if rests_on else 0)
    text = capsys.readouterr().out
    written = json.loads((tmp_path / "r" / "on-demand" / "summary.json").read_text())
    assert written["rests_on_degraded"] == rests_on
    assert written["baseline_fidelity"] == ("degraded" if "baseline" in degrade else "simulated")
    baseline_line = next(line for line in text.splitlines() if line.startswith("baseline "))
    assert baseline_line.endswith("%*") == bool(rests_on)
    for label in rests_on:
        assert f"  {label}: degraded (blamed on the machine: " in text
    assert ("exit status 3" in text) == bool(rests_on)


def test_run_with_a_degraded_baseline_says_so_in_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(study_run, "run_one", _fake_run_one(("baseline",)))
    assert main(["run", str(TINY), "--mode", "on-demand", "--baseline", "--iterations", "1",
                 "--json", "--out", str(tmp_path / "r")]) == 3
    printed = json.loads(capsys.readouterr().out)
    assert printed["fidelity"] == "simulated"  # the run itself is not degraded...
    assert printed["rests_on_degraded"] == ["baseline"]  # ...but its overhead is
    assert printed["baseline_fidelity_reasons"] == REASONS


def _fake_emu_points(bad: set[str], times: dict[str, float]
                     ) -> Callable[..., dict[str, Any]]:
    def run_point(_cfg: ExperimentConfig, point: sweep.Point, _run_dir: Path, _say: Any
                  ) -> dict[str, Any]:
        label = sweep.point_label(point)
        summary = {"iteration_time_s": times[label], "fidelity": "ok",
                   "fidelity_blame": "none", "fidelity_reasons": [], "wall_s": 1.0}
        return _degrade(summary) if label in bad else summary
    return run_point


TIMES = {"baseline": 1.0, "port-exact on-demand 100 ms": 1.2, "port-exact on-demand 250 ms": 1.5,
         "port-exact on-demand 500 ms": 2.0}


def _sweep(tmp_path: Path, bad: set[str], monkeypatch: pytest.MonkeyPatch,
           *extra: str) -> int:
    monkeypatch.setattr(sweep, "_run_emu_point", _fake_emu_points(bad, TIMES))
    return main(["sweep", str(TINY), "--delays", "0,100,250,500", "--modes", "on-demand",
                 "--out", str(tmp_path / "s"), *extra])


def test_a_sweep_on_a_degraded_baseline_marks_every_overhead_and_exits_3(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _sweep(tmp_path, {"baseline"}, monkeypatch) == 3
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["baseline", "0", "1.000*"]  # its own time
    for line in lines[2:5]:  # every overhead rests on the baseline; the times do not
        assert line.split()[4].endswith("*") and not line.split()[3].endswith("*"), line
    assert "on-demand, port-exact: slope 2.00 s/s (>= 250 ms), overhead at 100 ms +20.0* %" \
        in lines
    assert "  baseline: degraded (blamed on the machine: " in text
    with (tmp_path / "s" / "sweep.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [r["rests_on_degraded"] for r in table] == [
        "baseline", "baseline", "baseline", "baseline"]
    assert table[0]["fidelity_reasons"] == "; ".join(REASONS)
    meta = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert meta["rests_on_degraded"] == ["baseline"]
    (fam,) = meta["families"]
    assert fam["slope_rests_on_degraded"] == []  # the fitted times are clean
    assert fam["overhead_100ms_rests_on_degraded"] == ["baseline"]
    assert fam["rests_on_degraded"] == ["baseline"]


def test_a_sweep_with_a_degraded_point_marks_its_figures_and_the_slope(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _sweep(tmp_path, {"port-exact on-demand 250 ms"}, monkeypatch, "--json") == 3
    rows = {r["point"]: r for r in json.loads(capsys.readouterr().out)}
    bad = "port-exact on-demand 250 ms"
    assert rows[bad]["rests_on_degraded"] == [bad]
    assert rows["port-exact on-demand 100 ms"]["rests_on_degraded"] == []
    (fam,) = json.loads((tmp_path / "s" / "sweep.json").read_text())["families"]
    assert fam["slope_rests_on_degraded"] == [bad]
    assert fam["overhead_100ms_rests_on_degraded"] == []


def test_a_clean_emulated_sweep_exits_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert _sweep(tmp_path, set(), monkeypatch) == 0
    text = capsys.readouterr().out
    assert "*" not in text and "exit status" not in text


def test_a_sim_sweep_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(TINY), "--backend", "sim", "--delays", "0,10", "--modes",
                 "on-demand", "--workers", "1", "--iterations", "1",
                 "--out", str(tmp_path / "s")]) == 0
    assert "exit status" not in capsys.readouterr().out


def test_fit_families_names_the_degraded_runs_of_each_figure() -> None:
    rows = [{"mode": "baseline", "point": "baseline", "delay_ms": 0, "iteration_time_s": 1.0,
             "fidelity": "degraded"},
            {"mode": "on-demand", "point": "od 100", "delay_ms": 100, "iteration_time_s": 1.2,
             "overhead_pct": 20.0, "rests_on_degraded": "baseline"},  # as read from a CSV
            {"mode": "on-demand", "point": "od 250", "delay_ms": 250, "iteration_time_s": 1.5,
             "fidelity": "degraded"},
            {"mode": "on-demand", "point": "od 500", "delay_ms": 500, "iteration_time_s": 2.0}]
    (fam,) = fit_families(rows)
    assert fam["slope_rests_on_degraded"] == ["od 250"]
    assert fam["overhead_100ms_rests_on_degraded"] == ["baseline"]
    assert fam["rests_on_degraded"] == ["od 250", "baseline"]
    (single,) = fit_families(rows[:3])  # one point: no slope, so it rests on nothing
    assert single["slope_s_per_s"] is None and single["slope_rests_on_degraded"] == []


def _fake_run_sweep(bad: set[str]) -> Callable[..., list[dict[str, Any]]]:
    """``run_sweep`` of hand-made emulated-like summaries; points of ``bad`` degraded."""
    def run_sweep(_cfg: ExperimentConfig, delays_ms: list[float], modes: list[str], out: Path,
                  *_args: Any, semantics: Sequence[str] = ("port-exact",), **_kw: Any
                  ) -> list[dict[str, Any]]:
        out.mkdir(parents=True)
        points = sweep.sweep_points(modes, delays_ms, semantics)
        summaries = []
        for p in points:
            label = sweep.point_label(p)
            s = {"iteration_time_s": 1.0 + p[2] / 500, "fidelity": "ok"}
            summaries.append(_degrade(s) if f"{out.name}: {label}" in bad else s)
        return sweep.sweep_rows(points, summaries, [out / "x"] * len(points), "emu")
    return run_sweep


def _rail_state_tiny(tmp_path: Path) -> Path:
    """tiny.yaml under rail-state, where the every-call-asks rung changes something (under
    port-exact every call asks already: the ladder would not run it)."""
    path = tmp_path / "tiny-rail-state.yaml"
    path.write_text(TINY.read_text().replace("  switching_delay: 10\n",
                                             "  switching_delay: 10\n  semantics: rail-state\n"))
    return path


def test_a_ladder_figure_on_a_degraded_run_is_marked_and_exits_3(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    bad = "as-written: rail-state on-demand 100 ms"
    monkeypatch.setattr(sweep, "run_sweep", _fake_run_sweep({bad}))
    status = main(["ladder", str(_rail_state_tiny(tmp_path)), "--rungs", "every-call-asks",
                   "--modes", "on-demand",
                   "--delays", "100,250,500", "--out", str(tmp_path / "l")])
    assert status == 3
    text = capsys.readouterr().out
    written, every = text.splitlines()[1:3]
    # as-written: its 100 ms overhead (and its delta from itself) rest on the degraded point
    assert written.split()[3:5] == ["+20.0*", "+0.0*"] and written.split()[5] == "2.00"
    # every-call-asks: its own figures are clean; its delta from as-written is not
    assert every.split()[3:5] == ["+20.0", "+0.0*"]
    assert f"  {bad}: degraded (blamed on the machine: " in text
    result = json.loads((tmp_path / "l" / "ladder.json").read_text())
    assert result["rests_on_degraded"] == [bad]
    assert list(result["degraded_runs"]) == [bad]
    assert result["rungs"][1]["delta"]["on-demand"]["overhead_100ms_rests_on_degraded"] == [bad]
    assert result["rungs"][1]["delta"]["on-demand"]["slope_rests_on_degraded"] == []


def test_a_clean_ladder_exits_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "run_sweep", _fake_run_sweep(set()))
    assert main(["ladder", str(_rail_state_tiny(tmp_path)), "--rungs", "every-call-asks",
                 "--modes", "on-demand", "--delays", "100,250,500", "--json", "--out",
                 str(tmp_path / "l")]) == 0


def test_a_rebased_overhead_rests_on_its_new_baseline() -> None:
    rows = [{"mode": "on-demand", "point": "p", "iteration_time_s": 2.0, "fidelity": "ok",
             "rests_on_degraded": ["old baseline"]}]
    (row,) = ladder.rebase_rows(rows, 1.0, {"fidelity": "degraded"}, "new baseline")
    assert row["overhead_pct"] == 100.0 and row["rests_on_degraded"] == ["new baseline"]
    (row,) = ladder.rebase_rows(rows, 1.0, {"fidelity": "simulated"}, "new baseline")
    assert row["rests_on_degraded"] == []


def _crossval_result(fidelity: str) -> dict[str, Any]:
    emu = {"fidelity": fidelity, "fidelity_blame": "machine" if fidelity == "degraded"
           else "none", "fidelity_reasons": REASONS if fidelity == "degraded" else []}
    return {"emu_iteration_s": 1.05, "sim_iteration_s": 1.0, "ratio": 1 / 1.05,
            **crossval.degraded_marks(emu, {"fidelity": "simulated"})}


def test_a_crossval_ratio_rests_on_its_emulated_run() -> None:
    assert _crossval_result("ok")["rests_on_degraded"] == []
    marks = _crossval_result("degraded")
    assert marks["rests_on_degraded"] == ["emulated"]
    assert marks["degraded_figures"] == list(crossval.FIGURES)
    assert marks["degraded_runs"]["emulated"]["fidelity_reasons"] == REASONS
    point = crossval.crossval_point("rail-state", 100.0, marks)
    assert point["rests_on_degraded"] == ["rail-state 100 ms: emulated"]
    assert point["within_bound"] and point["agreement_pct"] == pytest.approx(5.0)


@pytest.mark.parametrize("as_json", [True, False])
def test_bench_crossval_exits_3_when_a_point_rests_on_a_degraded_run(
        as_json: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def fake(_config: Any, **kw: Any) -> dict[str, Any]:
        delay = kw["overrides"]["switching_delay"]
        return _crossval_result("degraded" if delay == 250 else "ok")

    monkeypatch.setattr(crossval, "run_crossval", fake)
    status = main(["bench", "crossval", str(TINY), "--delays", "100,250",
                   *(["--json"] if as_json else [])])
    assert status == 3
    out = capsys.readouterr().out
    if as_json:
        result = json.loads(out)
        assert result["rests_on_degraded"] == ["port-exact 250 ms: emulated"]
        assert [p["rests_on_degraded"] for p in result["points"]] == [
            [], ["port-exact 250 ms: emulated"]]
    else:
        assert "all_within_bound: True*" in out
        assert "  port-exact 250 ms: emulated: degraded (blamed on the machine: " in out
    monkeypatch.setattr(crossval, "run_crossval", lambda _c, **_kw: _crossval_result("ok"))
    assert main(["bench", "crossval", str(TINY), "--delays", "100", "--json"]) == 0


@pytest.mark.parametrize("command", [["run"], ["sweep"], ["ladder"], ["bench", "crossval"]])
def test_help_gives_exit_status_3(command: list[str], capsys: pytest.CaptureFixture[str]
                                  ) -> None:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit status:" in text and "3 " in text.split("Exit status:")[1]
