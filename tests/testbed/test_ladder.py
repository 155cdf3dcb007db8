"""The one-change-at-a-time ladder (``opus-testbed ladder``): each rung changes exactly one
setting, deltas are against the experiment as written, and the no-controller baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed.cli.main import main
from testbed.experiment.config import ExperimentConfig, load_experiment
from testbed.plan.replay import PlanOp
from testbed.plan.requestpoints import gated_calls
from testbed.studies import ladder as lad

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "examples" / "llama3-8b-artifact.yaml"
TINY = ROOT / "examples" / "tiny.yaml"


def _settings(cfg: ExperimentConfig) -> dict[str, object]:
    w = cfg.workload
    return {"semantics": cfg.semantics, "request_points": cfg.request_points,
            "rail_state_inflight": cfg.rail_state_inflight,
            "rail_state_ack_timeout_s": cfg.rail_state_ack_timeout_s,
            "rail_state_serialize_per_rank": cfg.rail_state_serialize_per_rank,
            "activation_checkpointing": w.activation_checkpointing,
            "reshard_after_forward": w.parallel.reshard_after_forward,
            "micro_batch_size": w.micro_batch_size, "num_microbatches": w.num_microbatches,
            "calibrate_step_s": w.calibrate_step_s}


def test_each_rung_changes_one_setting_of_the_artifact_example() -> None:
    cfg = load_experiment(ARTIFACT)
    before = _settings(cfg)
    changed = {}
    for rung in lad.RUNGS:
        after = _settings(rung.apply(cfg))
        changed[rung.name] = {k: after[k] for k in after if after[k] != before[k]}
    assert changed == {
        "as-written": {}, lad.NO_CONTROLLER: {},
        "port-exact": {"semantics": "port-exact"},
        "every-call-asks": {"request_points": "every"},
        "reflip": {"rail_state_inflight": "reflip"},
        "ack-timeout-10s": {"rail_state_ack_timeout_s": 10.0},
        "serialize-per-rank": {"rail_state_serialize_per_rank": True},
        "no-activation-checkpointing": {"activation_checkpointing": "none"},
        "reshard-default": {"reshard_after_forward": None},
        "micro-batches-8x1": {"micro_batch_size": 1, "num_microbatches": 8},
        "uncalibrated": {"calibrate_step_s": None}}
    assert lad.RUNGS[9].apply(cfg).workload.compute_scale == 1.0  # FLOPs as they are


def test_a_calibrated_variant_gets_its_own_compute_scale() -> None:
    cfg = load_experiment(ARTIFACT)
    rungs = {r.name: r for r in lad.RUNGS}
    assert lad.rung_config(cfg, rungs["port-exact"]).workload == cfg.workload
    no_ac = lad.rung_config(cfg, rungs["no-activation-checkpointing"]).workload
    # without the recomputed forward there is less compute to stretch to the same 10.18 s
    assert no_ac.compute_scale > cfg.workload.compute_scale
    assert lad.rung_config(cfg, rungs["uncalibrated"]).workload.compute_scale == 1.0


def test_rungs_are_selected_by_name_with_the_reference_first() -> None:
    assert [r.name for r in lad.select_rungs(["uncalibrated", "port-exact"])] == [
        "as-written", "port-exact", "uncalibrated"]
    with pytest.raises(lad.LadderError, match=r"unknown rungs \['semantic'\]"):
        lad.select_rungs(["semantic"])


def test_a_none_request_point_plan_never_asks() -> None:
    ops = [PlanOp(0, "fsdp0", (), kind="all_gather", axis="fsdp"), PlanOp(1, "compute", (), 0.5),
           PlanOp(2, "p2p0-1", (), kind="send", axis="pp")]
    assert gated_calls(ops, "none") == {0: False, 2: False}


def test_overheads_are_rebased_and_deltas_taken_against_the_first_rung() -> None:
    rows = [{"mode": "baseline", "iteration_time_s": 10.0},
            {"mode": "on-demand", "iteration_time_s": 11.0}, {"mode": "x", "iteration_time_s": ""}]
    assert [r["overhead_pct"] for r in lad.rebase_rows(rows, 8.0)] == [25.0, 37.5, None]
    rungs = lad.with_deltas([
        {"modes": {"on-demand": {"slope_s_per_s": 5.0, "overhead_100ms_pct": 7.0}}},
        {"modes": {"on-demand": {"slope_s_per_s": 8.0, "overhead_100ms_pct": 4.0},
                   "provisioning": {"slope_s_per_s": 1.0, "overhead_100ms_pct": 1.0}}}])
    def figures(delta: dict[str, Any]) -> dict[str, Any]:
        return {k: delta[k] for k in ("slope_s_per_s", "overhead_100ms_pct")}

    assert figures(rungs[0]["delta"]["on-demand"]) == {"slope_s_per_s": 0.0,
                                                       "overhead_100ms_pct": 0.0}
    assert {m: figures(d) for m, d in rungs[1]["delta"].items()} == {
        "on-demand": {"slope_s_per_s": 3.0, "overhead_100ms_pct": -3.0},
        "provisioning": {"slope_s_per_s": None, "overhead_100ms_pct": None}}
    assert all(d["rests_on_degraded"] == [] for r in rungs for d in r["delta"].values())


def test_ladder_runs_rungs_and_a_baseline_without_controller(tmp_path: Path) -> None:
    """Under the emulator's costs, where a controller round trip costs time (under ``fabric``
    it costs none: the rung's baseline differs only by the calls' rendezvous)."""
    cfg = load_experiment(TINY).replace(mode="on-demand", semantics="rail-state", iterations=1,
                                        sim_costs="emulator")
    ladder = lad.run_ladder(cfg, tmp_path / "l", [100, 250, 500], ["on-demand"], 2,
                            [lad.NO_CONTROLLER], lambda _m: None)
    assert json.loads((tmp_path / "l" / "ladder.json").read_text()) == json.loads(
        json.dumps(ladder))
    written, no_ctl = ladder["rungs"]
    assert [r["rung"] for r in ladder["rungs"]] == ["as-written", lad.NO_CONTROLLER]
    assert written["semantics"] == "rail-state"
    assert (tmp_path / "l" / "as-written" / "sweep.json").is_file()
    # no call pays a controller round trip: a shorter baseline, the same OCS points
    assert 0 < no_ctl["baseline_s"] < written["baseline_s"]
    od, od_nc = written["modes"]["on-demand"], no_ctl["modes"]["on-demand"]
    assert od_nc["slope_s_per_s"] == pytest.approx(od["slope_s_per_s"])
    step_100 = written["baseline_s"] * (1 + od["overhead_100ms_pct"] / 100)
    assert od_nc["overhead_100ms_pct"] == pytest.approx(100 * (step_100 / no_ctl["baseline_s"]
                                                               - 1))
    assert no_ctl["delta"]["on-demand"]["overhead_100ms_pct"] > 0
    assert ladder["reference"]["no_controller_s"] == pytest.approx(10.1775)


def test_cli_ladder_refuses_a_bad_rung_and_runs_nothing(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    out = tmp_path / "l"
    assert main(["ladder", str(TINY), "--rungs", "nope", "--out", str(out)]) == 2
    assert "unknown rungs ['nope']" in capsys.readouterr().err and not out.exists()
    assert main(["ladder", str(ARTIFACT), "--modes", "on-demand,degree-aware", "--out",
                 str(out)]) == 2
    assert "degree-aware" in capsys.readouterr().err and not out.exists()


def test_a_rung_that_changes_nothing_for_the_file_is_named_so() -> None:
    tiny = load_experiment(TINY)  # port-exact, uncalibrated, micro-batches of 1
    reasons = {r.name: lad.unchanged_reason(tiny, r) for r in lad.RUNGS}
    assert reasons == {
        "as-written": None, lad.NO_CONTROLLER: None,
        "port-exact": "already port-exact", "every-call-asks": "already every call asks",
        "reflip": "already port-exact, which ignores it",
        "ack-timeout-10s": "already port-exact, which ignores it",
        "serialize-per-rank": "already port-exact, which ignores it",
        "no-activation-checkpointing": "already no activation checkpointing",
        "reshard-default": "already reshard_after_forward: default",
        "micro-batches-8x1": "already micro-batches of 1 sample",
        "uncalibrated": "already uncalibrated"}
    artifact = load_experiment(ARTIFACT)  # every rung changes something there
    assert all(lad.unchanged_reason(artifact, r) is None for r in lad.RUNGS)
    reflipping = artifact.replace(rail_state_inflight="reflip")
    assert lad.unchanged_reason(reflipping, lad.RUNGS[3]) == "already reflip"


def test_a_rung_that_changes_nothing_is_not_run(tmp_path: Path) -> None:
    cfg = load_experiment(TINY).replace(iterations=1)
    said: list[str] = []
    ladder = lad.run_ladder(cfg, tmp_path / "l", [100, 250, 500], ["on-demand"], 2,
                            ["port-exact", "uncalibrated"], said.append)
    written, port_exact, uncalibrated = ladder["rungs"]
    assert "not_run" not in written and written["modes"]["on-demand"]["slope_s_per_s"]
    assert port_exact["not_run"] == "already port-exact" and port_exact["modes"] == {}
    assert uncalibrated["not_run"] == "already uncalibrated"
    assert not (tmp_path / "l" / "port-exact").exists()
    assert "rung port-exact: n/a (already port-exact), not run" in said
    from testbed.cli.experiments import ladder_lines

    lines = ladder_lines(ladder)
    assert any(line.startswith("port-exact ") and "n/a (already port-exact): not run" in line
               for line in lines)


def test_progress_is_formatted_like_the_table() -> None:
    rung = {"baseline_s": 0.13211172751339736, "modes": {
        "on-demand": {"overhead_100ms_pct": 964.87432694309, "slope_s_per_s": 12.00000000000001},
        "provisioning": {"overhead_100ms_pct": None, "slope_s_per_s": None}}}
    assert lad.progress_text(rung) == (
        "baseline 0.132 s; on-demand: +964.9 % at 100 ms, slope 12.00 s/s; "
        "provisioning: n/a at 100 ms, slope n/a")
