"""The simulation backend and sweeps on it (no root): same results format as emulated runs."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.experiment.config import load_experiment
from testbed.experiment.prepare import prepare
from testbed.simulator.run import run_simulated
from testbed.studies.sweep import run_sweep

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"


@pytest.mark.parametrize("mode", ["baseline", "on-demand", "provisioning"])
def test_sim_run_completes_and_delivers(mode: str, tmp_path: Path) -> None:
    cfg = load_experiment(TINY).replace(mode=mode)
    s = run_simulated(prepare(cfg, check_capacity=False), tmp_path / mode, lambda _m: None)
    assert s["all_iterations_completed"] and s["calls"] == s["calls_delivered"] > 0
    assert s["bytes_received_scaled"] == s["bytes_expected_scaled"]
    assert (s["reconfigurations"] == 0) == (mode == "baseline")
    written = json.loads((tmp_path / mode / "summary.json").read_text())
    assert written["backend"] == "sim"
    # a virtual clock has nothing to judge: no "ok" without a measurement
    for summary in (s, written):
        assert (summary["fidelity"], summary["fidelity_blame"], summary["fidelity_reasons"]) == (
            "simulated", "none", [])


def test_sweep_writes_rows_against_its_own_baseline(tmp_path: Path) -> None:
    cfg = load_experiment(TINY)
    rows = run_sweep(cfg, [0, 10, 50], ["on-demand", "provisioning"], tmp_path, "sim", 1,
                     lambda _m: None)
    assert [(r["mode"], r["delay_ms"]) for r in rows] == [
        ("baseline", 0.0), ("on-demand", 10), ("on-demand", 50), ("provisioning", 10),
        ("provisioning", 50)]
    with (tmp_path / "sweep.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert {"mode", "delay_ms", "iteration_time_s", "overhead_pct"} <= set(table[0])
    assert {(r["fidelity"], r["fidelity_blame"]) for r in table} == {("simulated", "none")}
    base = float(table[0]["iteration_time_s"])
    for row in table[1:]:
        expected = 100 * (float(row["iteration_time_s"]) - base) / base
        assert float(row["overhead_pct"]) == pytest.approx(expected)
    od = {float(r["delay_ms"]): float(r["iteration_time_s"]) for r in table
          if r["mode"] == "on-demand"}
    assert od[50] > od[10] > base  # overhead grows with the switching delay
    assert (tmp_path / "iteration_vs_delay.png").stat().st_size > 0


def test_cli_run_on_the_sim_backend_exits_0_and_says_simulated(tmp_path: Path) -> None:
    """Exit status 3 is for a degraded run; a simulated one is not judged, so it exits 0."""
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "testbed.cli.main", "run", str(TINY),
                          "--backend", "sim", "--out", str(out)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "fidelity            simulated" in res.stdout
    assert json.loads((out / "summary.json").read_text())["fidelity"] == "simulated"
