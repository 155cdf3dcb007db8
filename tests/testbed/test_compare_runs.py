"""``opus-testbed compare`` and the folders ``report``, ``export perfetto`` and ``compare``
accept: run --baseline's folder (both runs), a sweep, or a message naming the folders to give.
Fixtures are simulated runs; every example of the three commands' --help runs on them."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from testbed.cli.compare import EPILOG
from testbed.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "tiny.yaml")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folders the help examples name, under ``results/``: two run --baseline folders
    (10 ms provisioning, 25 ms on-demand) and two small sweeps (K=1, K=2)."""
    root = tmp_path_factory.mktemp("compare") / "results"
    assert main(["run", TINY, "--backend", "sim", "--baseline", "--out",
                 str(root / "my-sim")]) == 0
    assert main(["run", TINY, "--backend", "sim", "--baseline", "--mode", "on-demand",
                 "--delay", "25", "--out", str(root / "my-sim25")]) == 0
    for name, extra in (("sweep-a", []), ("sweep-b", ["--ports-per-rank", "2"])):
        assert main(["sweep", TINY, "--backend", "sim", "--delays", "0,0.01,500",
                     "--out", str(root / name), *extra]) == 0
    (root / "my-sweep").symlink_to(root / "sweep-a")
    return root


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _figure(table: dict[str, Any], key: str) -> dict[str, Any]:
    return next(r for r in table["figures"] if r["figure"] == key)


def test_a_baseline_folder_alone_compares_its_baseline_with_its_run(
        results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = _json(["compare", str(results / "my-sim")], capsys)
    summary = json.loads((results / "my-sim/provisioning/summary.json").read_text())
    assert [r["mode"] for r in table["runs"]] == ["baseline", "provisioning"]
    it = _figure(table, "iteration_time_s")
    assert it["values"]["B"] == summary["iteration_time_s"]
    assert it["differences"]["B-A"] == pytest.approx(
        summary["iteration_time_s"] - summary["baseline_iteration_time_s"])
    assert _figure(table, "overhead_pct")["values"] == {"A": 0.0, "B": summary["overhead_pct"]}
    assert {d["setting"] for d in table["config_differences"]} >= {"config.mode",
                                                                   "config.switching_delay_ms"}


def test_two_runs_side_by_side_name_what_differs(results: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(results / "my-sim"), str(results / "my-sim25")]) == 0
    text = capsys.readouterr().out
    for line in ("iteration time (s)", "overhead vs the baseline (%)",
                 "exposed switching per iteration (s)", "reconfigurations per iteration",
                 "windows at least the run's delay (%)", "gaps (the switched run's own)",
                 "fidelity", "settings that differ:"):
        assert line in text, line
    diffs = {ln.split()[0]: ln.split()[1:] for ln in text.split("settings that differ:")[1]
             .splitlines() if ln.strip()}
    assert diffs["config.switching_delay_ms"] == ["A=10.0", "B=25.0"]
    assert diffs["config.mode"] == ["A=provisioning", "B=on-demand"]
    assert "-0.000" not in text


def test_two_sweeps_point_by_point(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = _json(["compare", str(results / "sweep-a"), str(results / "sweep-b")], capsys)
    assert table["kind"] == "sweeps"
    assert len(table["points"]) == 5  # the baseline, 2 modes x 2 delays
    assert table["config_differences"] == [{"setting": "config.ports_per_rank",
                                            "values": {"A": 1, "B": 2}}]
    p500 = next(p for p in table["points"] if p["mode"] == "on-demand"
                and p["delay_ms"] == 500)
    assert p500["differences"]["B-A"]["iteration_time_s"] < 0  # K=2 switches less


@pytest.mark.parametrize("argv", [["compare", "RESULTS/sweep-a", "RESULTS/my-sim"],
                                  ["compare", "RESULTS"], ["compare", "RESULTS/my-sim/baseline"],
                                  ["report", "RESULTS"], ["export", "perfetto", "RESULTS"],
                                  ["export", "perfetto", "RESULTS/my-sim", "--out", "t.json"]])
def test_a_folder_that_will_not_do_exits_2_naming_what_would(
        argv: list[str], results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main([a.replace("RESULTS", str(results)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    if argv[-1] == "RESULTS":  # the parent of everything: each folder inside is named
        assert f"{results / 'my-sim'} (run --baseline: baseline and MODE)" in err
        assert f"{results / 'sweep-a'} (a sweep)" in err


def test_report_and_export_act_on_both_runs_of_a_baseline_folder(
        results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(results / "my-sim")]) == 0
    out = capsys.readouterr().out
    for run in ("baseline", "provisioning"):
        assert f"wrote {results / 'my-sim' / run / 'timeline.png'}" in out
    written = _json(["export", "perfetto", str(results / "my-sim")], capsys)
    assert [Path(r["file"]) for r in written["runs"]] == [
        results / "my-sim" / run / "trace.json" for run in ("baseline", "provisioning")]


def test_a_degraded_run_is_named_with_its_reasons_and_exits_3(
        results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    run = tmp_path / "degraded"
    shutil.copytree(results / "my-sim" / "provisioning", run)
    summary = json.loads((run / "summary.json").read_text())
    summary.update(fidelity="degraded", fidelity_reasons=["the machine's CPU was saturated"])
    (run / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    assert main(["compare", str(results / "my-sim"), str(run)]) == 3
    assert "B is degraded: the machine's CPU was saturated" in capsys.readouterr().out


def test_plot_goes_to_a_file_or_into_a_folder(tmp_path: Path) -> None:
    from testbed.cli.compare import plot_path

    assert plot_path(str(tmp_path)) == tmp_path / "compare.png"
    assert plot_path("out/") == Path("out/compare.png")
    assert plot_path("out") == Path("out/compare.png")
    assert plot_path("out/a.svg") == Path("out/a.svg")


def _examples(epilog: str) -> list[list[str]]:
    return [shlex.split(line.split("#")[0])[1:] for line in epilog.splitlines()
            if line.strip().startswith("opus-testbed ")]


def test_every_help_example_of_compare_report_and_export_runs(
        results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples of ``compare``, ``report`` and ``export perfetto`` --help, run in the
    folder holding ``results/``: each exits 0."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[attr-defined]
    export = next(a for a in sub["export"]._actions if a.dest == "format").choices
    epilogs = [EPILOG, sub["report"].epilog, export["perfetto"].epilog]
    examples = [words for epilog in epilogs for words in _examples(epilog)]
    assert len(examples) == 7
    monkeypatch.chdir(results.parent)
    for words in examples:
        assert main(words) == 0, words
