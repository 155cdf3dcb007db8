"""Rail-state semantics end to end on the sim backend: request points, experiment files, runs,
and sweeps that compare port-exact with rail-state (no root)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from testbed.experiment.config import load_experiment
from testbed.experiment.prepare import prepare
from testbed.metrics.fit import fit_families
from testbed.plan.replay import PlanError, PlanOp, ReplayPlan
from testbed.plan.requestpoints import (
    gated_calls,
    lane_positions,
    predict_targets,
    predicted_call,
    with_request_points,
)
from testbed.results.reference import artifact_reference
from testbed.simulator.run import run_simulated, simulate_plan
from testbed.studies.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.yaml"


def _call(i: int, lane: str, kind: str, axis: str, thread: str = "main") -> PlanOp:
    return PlanOp(i, lane, (), kind=kind, axis=axis, thread=thread)


#: one stage-0 step as the main thread issues it (compute omitted but for one block), with a
#: backward all-gather on the autograd thread between the pipeline ops
STEP = [
    _call(0, "fsdp0", "all_gather", "fsdp"),      # F0 gather: after the last PP op (cyclic)
    _call(1, "fsdp0", "all_gather", "fsdp"),      # same phase
    PlanOp(2, "compute", (), 0.5),
    _call(3, "p2p0-2", "send", "pp"),             # every PP op asks
    _call(4, "fsdp0", "all_gather", "fsdp", "autograd"),  # invisible: never asks, no phase
    _call(5, "p2p0-2", "recv", "pp"),
    _call(6, "fsdp0", "reduce_scatter", "fsdp"),  # first DP call after a PP op
    _call(7, "pp0", "all_reduce", "pp"),          # grad norm: never asks, ends the DP phase
    _call(8, "fsdp0", "all_reduce", "fsdp"),      # after the PP all-reduce: asks
]


def test_phase_request_points_on_a_hand_step() -> None:
    gated = gated_calls(STEP, "phase")
    assert [i for i, g in sorted(gated.items()) if g] == [3, 5, 6, 8]
    assert not gated[0]  # the last visible call before it (cyclic) is fsdp, not PP
    assert all(gated_calls(STEP, "every").values())
    # the call right before each gated call provisions it; the last wraps to the next step
    assert predict_targets(STEP, gated, "phase") == {1: 3, 3: 5, 5: 6, 7: 8}
    assert predict_targets(STEP, gated_calls(STEP, "every"), "every")[8] == 0


def test_without_pipeline_calls_the_first_call_asks() -> None:
    ops = [_call(0, "fsdp0", "all_gather", "fsdp"), _call(1, "fsdp0", "reduce_scatter", "fsdp")]
    assert gated_calls(ops, "phase") == {0: True, 1: False}


def test_predicted_call_numbers_across_iterations() -> None:
    positions = lane_positions(STEP)
    assert positions[6] == (3, 5)  # fsdp0's fourth call of five per step
    assert predicted_call(positions, 5, 6, 2) == (2 * 5 + 3, 2)
    assert predicted_call(positions, 8, 0, 2) == (3 * 5 + 0, 3)  # wraps into the next step


def test_members_must_agree_on_which_calls_ask() -> None:
    other = [_call(0, "fsdp0", "all_gather", "fsdp"), _call(1, "p2p1-3", "send", "pp")]
    plan = ReplayPlan({0: STEP, 1: other}, {}, 1.0)
    with pytest.raises(PlanError, match="group fsdp0: ranks 0 and 1 disagree"):
        with_request_points(plan, "phase", predict=False)


def test_cli_refuses_bad_semantics_before_anything_starts(tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(TINY.read_text().replace("  switching_delay: 10",
                                               "  switching_delay: 10\n  semantics: exact"))
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "testbed.cli.main", "run", str(config),
                          "--backend", "sim", "--out", str(out)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 2
    assert f"{config}:18:14: ocs.semantics: must be one of port-exact, rail-state" in res.stderr
    assert not out.exists()


def test_rail_state_sim_run_flips_bits_on_shadow_rails(tmp_path: Path) -> None:
    """The data rail is packet-switched (one port per rank, never reconfigured); bits 0 and 1
    flip on shadow rails 1 and 2."""
    cfg = load_experiment(TINY).replace(mode="on-demand", semantics="rail-state",
                                        switching_delay=100.0, ports_per_rank=2)
    assert cfg.effective_ports_per_rank == 1  # rail-state ignores ports_per_rank
    prep = prepare(cfg, check_capacity=False)
    s = run_simulated(prep, tmp_path, lambda _m: None)
    assert s["all_iterations_completed"] and s["calls"] == s["calls_delivered"] > 0
    assert (s["semantics"], s["request_points"], s["ports_per_rank"]) == ("rail-state", "phase",
                                                                          1)
    events = [json.loads(line) for line in (tmp_path / "controller-events.jsonl").open()]
    starts = Counter(e["rail"] for e in events if e["event"] == "reconfig_start")
    assert set(starts) == {1, 2}
    with (tmp_path / "rails.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert {int(r["rail"]): (r["role"], int(r["reconfigurations"]) > 0) for r in table} == {
        0: ("data", False), 1: ("shadow", True), 2: ("shadow", True)}
    counts = s["rail_state"]  # every changed bit is one shadow-rail switch
    assert counts["bit_flips"] == sum(int(r["reconfigurations"]) for r in table
                                      if r["role"] == "shadow") > 0
    assert 0 < counts["acked_at_once"] < counts["served"]
    # only the plan's gated calls ask: 6 of 8 calls per step on stage 0, 7 of 8 on stage 1
    # (stage 0: not its grad-norm all-reduces; stage 1: not the pipeline's)
    intents = Counter(e["rank"] for e in events if e["event"] == "intent")
    per_step = {r: n / cfg.total_iterations for r, n in intents.items()}
    assert per_step == {0: 6, 1: 6, 2: 7, 3: 7}


def test_rail_state_with_every_request_point_asks_at_every_call() -> None:
    cfg = load_experiment(TINY).replace(mode="provisioning", semantics="rail-state",
                                        request_points="every")
    prep = prepare(cfg, check_capacity=False)
    _records, events = simulate_plan(prep)
    calls = {r: sum(op.is_call for op in ops) for r, ops in prep.plan.programs.items()}
    intents = Counter(e["rank"] for e in events if e["event"] == "intent")
    assert intents == {r: n * cfg.total_iterations for r, n in calls.items()}


def test_fit_families_on_hand_rows() -> None:
    rows = [
        {"mode": "baseline", "semantics": "", "delay_ms": 0, "iteration_time_s": 9.0},
        *({"mode": "on-demand", "semantics": "rail-state", "delay_ms": d, "iteration_time_s": t,
           "overhead_pct": ov, "exposed_reconfig_s": ex}
          for d, t, ov, ex in ((100, 10.0, 11.1, 0.8), (250, 11.0, 0, 0), (500, 12.5, 0, 0),
                               (1000, 15.5, 0, 0))),
        {"mode": "provisioning", "semantics": "rail-state", "delay_ms": 250,
         "iteration_time_s": 10.0},
        {"mode": "provisioning", "semantics": "rail-state", "delay_ms": 500,
         "iteration_time_s": None, "error": "failed"},
    ]
    fams = {f["mode"]: f for f in fit_families(rows)}
    assert set(fams) == {"on-demand", "provisioning"}
    od = fams["on-demand"]
    assert od["slope_s_per_s"] == pytest.approx(6.0) and od["intercept_s"] == pytest.approx(9.5)
    assert (od["slope_points"], od["overhead_100ms_pct"], od["exposed_100ms_s"]) == (3, 11.1, 0.8)
    prov = fams["provisioning"]
    assert prov["slope_s_per_s"] is None and prov["slope_points"] == 1
    assert prov["overhead_100ms_pct"] is None  # no 100 ms row: never read off the line


def test_artifact_reference_slopes() -> None:
    ref = {f["mode"]: f for f in artifact_reference()["families"]}
    assert ref["on-demand"]["slope_s_per_s"] == pytest.approx(5.653, abs=1e-3)
    assert ref["provisioning"]["slope_s_per_s"] == pytest.approx(5.468, abs=1e-3)
    assert ref["on-demand"]["overhead_100ms_pct"] == pytest.approx(7.14, abs=0.01)


def test_sweep_compares_the_two_semantics(tmp_path: Path) -> None:
    cfg = load_experiment(TINY)
    rows = run_sweep(cfg, [0, 100, 250, 500], ["on-demand"], tmp_path, "sim", 2,
                     lambda _m: None, semantics=["port-exact", "rail-state"])
    assert [(r["semantics"], r["delay_ms"]) for r in rows] == [
        ("", 0.0), ("port-exact", 100.0), ("port-exact", 250.0), ("port-exact", 500.0),
        ("rail-state", 100.0), ("rail-state", 250.0), ("rail-state", 500.0)]
    assert all(not r["error"] for r in rows)
    with (tmp_path / "sweep.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert list(table[0])[:3] == ["mode", "semantics", "delay_ms"]
    assert Path(table[4]["run_dir"]).name == "rail-state-on-demand-100ms"
    summary = json.loads((Path(table[4]["run_dir"]) / "summary.json").read_text())
    assert summary["semantics"] == "rail-state"
    meta = json.loads((tmp_path / "sweep.json").read_text())
    fams = {f["semantics"]: f for f in meta["families"]}
    assert set(fams) == {"port-exact", "rail-state"}
    for fam in fams.values():
        assert fam["slope_points"] == 2 and fam["slope_s_per_s"] > 0
        assert fam["overhead_100ms_pct"] == pytest.approx(next(
            float(r["overhead_pct"]) for r in table
            if r["semantics"] == fam["semantics"] and float(r["delay_ms"]) == 100))
    # tiny is not the artifact's workload: its points stay off the sweep (--reference adds them)
    assert meta["reference"] is None and meta["reference_matches"] is False
    assert (tmp_path / "iteration_vs_delay.png").stat().st_size > 0
