"""Windows mean what the README says (issue 36, item 3): the gaps between parallelism phases
that the workload offers, measured on the electrical baseline (paper §3.1: a call starts when
its slowest member joins); a switched run's own gaps hold its waits for light and are reported
apart, as gaps; the CDF's reference is the run's switching delay and empty windows are counted,
not drawn; and the relation the README claims: exposed switching bounds the overhead."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from testbed.metrics.compute import window_figures, window_table
from testbed.results import plots, store

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.yaml"


def _call(rank: int, cid: str, group: str, axis: str, kind: str, t_intent: float,
          t_ack: float, t_end: float) -> dict[str, Any]:
    return {"rank": rank, "iteration": 1, "collective": cid, "group": group, "axis": axis,
            "kind": kind, "t_intent_s": t_intent, "t_ack_s": t_ack, "t_end_s": t_end,
            "size_bytes": 1 << 20, "superseded": False, "epoch": 0}


def test_a_phase_starts_when_its_slowest_member_joins_not_at_the_ack() -> None:
    """Rank 0 ends an all-gather at 1.0 s; its next phase's send/recv has rank 1 join last at
    1.5 s and the circuits light at 3.0 s: the window is 0.5 s (what the workload offers),
    not 2.0 s (which would count the wait for light)."""
    calls = [_call(0, "ag", "fsdp0", "fsdp", "all_gather", 0.0, 0.0, 1.0),
             _call(1, "ag", "fsdp0", "fsdp", "all_gather", 0.0, 0.0, 1.0),
             _call(0, "pp", "p2p0-1", "pp", "send", 1.2, 3.0, 3.5),
             _call(1, "pp", "p2p0-1", "pp", "recv", 1.5, 3.0, 3.5)]
    rows = window_table(calls, warmup=1)
    assert [(r["rank"], r["window_s"]) for r in rows] == [(0, pytest.approx(0.5)),
                                                          (1, pytest.approx(0.5))]


def test_overlapping_phases_give_empty_windows_that_are_counted() -> None:
    """The next phase's slowest member joined before this rank's phase ended: an empty
    window (<= 0), counted as such; the share at least the delay counts it as shorter."""
    calls = [_call(0, "ag", "fsdp0", "fsdp", "all_gather", 0.0, 0.0, 1.0),
             _call(0, "pp", "p2p0-1", "pp", "send", 0.5, 1.1, 1.3),
             _call(1, "pp", "p2p0-1", "pp", "recv", 0.6, 1.1, 1.3),
             _call(0, "ag2", "fsdp0", "fsdp", "all_gather", 1.4, 1.4, 1.6)]
    rows = window_table(calls, warmup=1)
    assert [round(r["window_s"], 3) for r in rows if r["rank"] == 0] == [-0.4, 0.1]
    figures = window_figures(rows, delay_ms=50.0)
    assert (figures["windows"], figures["windows_empty"]) == (2, 1)
    assert figures["windows_at_least_delay_pct"] == 50.0
    assert window_figures(rows, "gaps")["gaps_empty"] == 1


def test_the_median_window_is_the_projects_percentile() -> None:
    """An even count's median is the mean of the two middle windows (controller.stats), not
    the upper one; none for no window."""
    rows = [{"window_s": w} for w in (0.4, 0.1, 0.3, 0.2)]
    assert window_figures(rows)["window_median_s"] == pytest.approx(0.25)
    assert window_figures([])["window_median_s"] is None


def test_the_cdf_draws_the_delay_and_does_not_draw_empty_windows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[Any] = []
    monkeypatch.setattr(plt, "close", shown.append)
    rows = [{"window_s": w, "volume_bin": "< 1 MiB"} for w in (-0.002, 0.0, 0.004, 0.02)]
    plots.window_cdf(rows, tmp_path / "w.png", "t", delay_ms=10.0)
    ax = shown[0].axes[0]
    xs = [x for line in ax.lines for x in line.get_xdata()]
    assert 10.0 in xs  # the reference line at the run's switching delay
    assert 1.0 not in xs and 1e-3 not in xs  # no 1 ms line, nothing drawn at 1 µs
    assert min(xs) == pytest.approx(4.0)
    curve = ax.lines[0]  # "all": starts at the empty share (2 of 4), ends at 1
    assert list(curve.get_ydata()) == [0.75, 1.0]
    assert "2 empty" in curve.get_label()
    plt.close("all")


def _sim(*args: str, cwd: Path) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-m", "testbed.cli.main", *args, "--json"], cwd=cwd,
                         capture_output=True, text=True, timeout=300, check=False,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout) if res.stdout.lstrip().startswith("{") else {
        "rows": json.loads(res.stdout)}
    return out


def test_windows_are_the_baselines_whatever_the_delay(tmp_path: Path) -> None:
    """The switched run reports its baseline's windows (the same at 1 and 25 ms) and its own
    gaps apart; its gaps hold its waits for light (at 25 ms, longer)."""
    runs = {d: _sim("run", str(TINY), "--backend", "sim", "--baseline", "--delay", str(d),
                    "--out", str(tmp_path / f"d{d}"), cwd=tmp_path) for d in (1, 25)}
    for d, s in runs.items():
        base = json.loads((tmp_path / f"d{d}" / "baseline" / "summary.json").read_text())
        assert (s["windows"], s["window_median_s"], s["windows_empty"]) == (
            base["windows"], base["window_median_s"], base["windows_empty"])
        assert base.get("gaps") is None and s["gaps"]
        run_dir = tmp_path / f"d{d}" / "provisioning"
        assert store.read_csv(run_dir / "windows.csv") == store.read_csv(
            tmp_path / f"d{d}" / "baseline" / "windows.csv")
        assert (run_dir / "gaps.csv").exists() and (run_dir / "windows_cdf.png").exists()
    assert runs[1]["windows"] == runs[25]["windows"]
    assert runs[25]["gap_median_s"] > runs[25]["window_median_s"]  # waits for light inside
    assert runs[1]["windows_at_least_delay_pct"] > runs[25]["windows_at_least_delay_pct"]


def test_exposed_switching_bounds_the_overhead(tmp_path: Path) -> None:
    """The README's claim: exposure counts every wait for light, also those off the critical
    path, so the step grows by at most the exposure (overhead_s <= exposed_reconfig_s) at every
    delay, in both modes; the exposure grows with the delay."""
    rows = _sim("sweep", str(TINY), "--backend", "sim", "--delays", "0,0.01,1,10,100",
                "--out", str(tmp_path / "sw"), cwd=tmp_path)["rows"]
    base = next(r for r in rows if r["mode"] == "baseline")["iteration_time_s"]
    for mode in ("on-demand", "provisioning"):
        points = sorted((float(r["delay_ms"]), r) for r in rows if r["mode"] == mode)
        for delay, r in points:
            overhead_s = r["iteration_time_s"] - base
            assert 0 < overhead_s <= r["exposed_reconfig_s"], (mode, delay, r)
        exposures = [r["exposed_reconfig_s"] for _d, r in points]
        assert exposures == sorted(exposures), (mode, exposures)
    # every switched point of the sweep reports the baseline's windows, as run --baseline does
    windows = {json.loads((Path(r["run_dir"]) / "summary.json").read_text())["windows"]
               for r in rows}
    assert len(windows) == 1 and None not in windows
