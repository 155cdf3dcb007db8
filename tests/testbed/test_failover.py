"""Failover on the sim backend, one test per fault kind, and the failover metrics (no root).

The sim runs examples/failover.yaml (the tiny job, four ranks, a spare server) with the faults
each test names; every run checks the physical invariants on every event, across the failover.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controller.job import JobError, spare_slots
from testbed.cli.main import main
from testbed.experiment.config import ExperimentConfig, load_experiment
from testbed.experiment.faults import FailoverSettings, Fault
from testbed.experiment.prepare import prepare
from testbed.metrics.compute import compute_metrics, iteration_table
from testbed.metrics.failover import failover_summary, failover_table
from testbed.results.summary import failover_keys
from testbed.simulator.engine import SimulationError
from testbed.simulator.failover import FailoverCosts, FailoverSimulation
from testbed.simulator.run import build_simulation, run_simulated
from workloads.errors import WorkloadConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "failover.yaml"
COSTS = FailoverCosts()


def _config(faults: list[Fault], **changes: Any) -> ExperimentConfig:
    base = load_experiment(EXAMPLE)
    return base.replace(faults=tuple(faults), **changes)


def _run(cfg: ExperimentConfig) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's summary figures and controller events, without writing a results directory."""
    prep = prepare(cfg, check_capacity=False)
    records, events = build_simulation(prep).run()
    m = compute_metrics(records, events, warmup=cfg.warmup, link_mbps=prep.link_mbps,
                        scale=prep.scale, num_rails=1)
    _rows, keys = failover_keys(prep, records, events, m.iterations)
    return {**m.summary, **keys,
            "all_iterations_completed": m.summary["iterations_completed"]
            == cfg.total_iterations}, events


def _assert_recovered(summary: dict[str, Any], cfg: ExperimentConfig, failovers: int) -> None:
    assert summary["all_iterations_completed"], summary
    assert summary["failovers"] == failovers
    assert summary["after_resume_delivered"]
    assert summary["calls_after_resume"] == summary["calls_after_resume_expected"] > 0
    assert (summary["bytes_after_resume_received"] == summary["bytes_after_resume_expected"]
            > 0)
    assert summary["calls"] == summary["calls_delivered"]


def _steps(events: list[dict[str, Any]]) -> list[str]:
    names = ("fault", "failure_detected", "epoch_aborted", "job_unregistered", "spare_assigned",
             "job_registered", "ranks_resumed")
    return [e["event"] for e in events if e["event"] in names]


# --- each fault kind on the sim backend ---------------------------------------------------------


def test_kill_moves_the_rank_to_the_spare_and_the_run_completes(tmp_path: Path) -> None:
    cfg = _config([Fault("kill", 0, rank=2, at_iteration=3)])
    summary = run_simulated(prepare(cfg, check_capacity=False), tmp_path / "run",
                            say=lambda _m: None)
    events = [json.loads(line) for line in (tmp_path / "run" / "controller-events.jsonl").open()]
    _assert_recovered(summary, cfg, 1)
    assert _steps(events)[1:] == ["fault", "failure_detected", "epoch_aborted",
                                  "job_unregistered", "spare_assigned", "job_registered",
                                  "ranks_resumed"]
    (row,) = summary["recovery"]
    assert (row["rank"], row["host"], row["via"], row["fault"]) == (2, 4, "exit", "kill")
    assert row["detection_s"] == pytest.approx(COSTS.detect_exit_s)
    assert row["rewiring_s"] == pytest.approx(cfg.switching_delay_ms / 1e3)  # one switch
    assert row["restart_s"] > COSTS.restart_s
    assert row["recovery_s"] == pytest.approx(
        row["detection_s"] + row["rewiring_s"] + row["restart_s"])
    spare_ports = spare_slots(4, 1, 1, spare_servers=1)[0].ports
    assigned = next(e for e in events if e["event"] == "spare_assigned")
    assert tuple(assigned["new_ports"]) == spare_ports and assigned["old_ports"] == [3]
    t_resume = row["t_resume_s"]
    later = [e for e in events if e["event"] == "reconfig_start" and e["t_s"] >= t_resume]
    assert any(spare_ports[0] in e["ports"] for e in later)  # Opus rewired to the spare
    assert not any(3 in c for e in later for c in e["add"])  # and never to the dead port
    assert summary["iteration_time_before_s"] and summary["iteration_time_after_s"]
    assert (tmp_path / "run" / "failovers.csv").exists()
    assert (tmp_path / "run" / "failover0.png").stat().st_size > 0


def test_link_down_at_a_time_fails_over() -> None:
    cfg = _config([Fault("link_down", 0, rank=1, at_s=0.8)])
    summary, _events = _run(cfg)
    _assert_recovered(summary, cfg, 1)
    assert summary["recovery"][0]["fault"] == "link_down"


def test_hang_is_detected_by_the_heartbeat_timeout() -> None:
    cfg = _config([Fault("hang", 0, rank=0, at_iteration=2)])
    summary, _events = _run(cfg)
    _assert_recovered(summary, cfg, 1)
    (row,) = summary["recovery"]
    assert row["via"] == "heartbeat"
    timeout = cfg.failover.heartbeat_timeout_s
    assert row["detection_s"] == pytest.approx(timeout + COSTS.heartbeat_extra_s)
    assert row["heartbeat_s"] == pytest.approx(row["detection_s"])


def test_a_failed_port_moves_its_rank_and_is_never_used_again() -> None:
    cfg = _config([Fault("port_failed", 0, rail=0, port=2, at_iteration=2)])
    summary, events = _run(cfg)
    _assert_recovered(summary, cfg, 1)
    assert summary["recovery"][0]["rank"] == 1  # rank 1 owns port 2
    t_fault = next(e["t_s"] for e in events if e["event"] == "fault")
    assert not any(2 in c for e in events if e["event"] == "reconfig_start"
                   and e["t_s"] > t_fault for c in e["add"])


def test_jitter_spreads_the_switching_time() -> None:
    cfg = _config([Fault("jitter", 0, jitter_ms=4.0)])
    summary, events = _run(cfg)
    assert summary["all_iterations_completed"] and summary["faults_injected"] == 1
    dark = [e["dark_ms"] for e in events if e["event"] == "reconfig_end"]
    assert all(6.0 - 1e-6 <= d <= 14.0 + 1e-6 for d in dark)
    assert max(dark) - min(dark) > 2.0


def test_refused_reconfigurations_are_asked_for_again() -> None:
    cfg = _config([Fault("refuse", 0, count=2, at_iteration=1)])
    summary, events = _run(cfg)
    assert summary["all_iterations_completed"]
    assert summary["reconfigurations_refused"] == 2
    assert summary["call_retries"] >= 2
    assert sum(1 for e in events if e["event"] == "reconfig_failed") == 2
    assert summary["calls"] == summary["calls_delivered"]


def test_no_spares_restarts_every_rank_after_the_migration_delay() -> None:
    cfg = _config([Fault("kill", 0, rank=2, at_iteration=3)], no_spares=True,
                  failover=FailoverSettings(migration_delay_s=2.0))
    summary, events = _run(cfg)
    assert summary["failovers"] == 0 and summary["restarts"] == 1
    assert summary["after_resume_delivered"] and summary["all_iterations_completed"]
    (row,) = summary["recovery"]
    assert row["restart_s"] > COSTS.restart_all_s + 4 * COSTS.restart_all_per_rank_s + 2.0
    assert not any(e["event"] == "spare_assigned" for e in events)


def test_repaired_hosts_let_one_spare_serve_several_failures() -> None:
    faults = [Fault("kill", 0, rank=2, at_iteration=2), Fault("kill", 1, rank=0, at_iteration=4)]
    with pytest.raises(WorkloadConfigError, match="not enough spares"):
        _config(faults, iterations=6)  # no repair: two failures, one spare
    cfg = _config(faults, iterations=6, failover=FailoverSettings(repair_s=0.5))
    summary, events = _run(cfg)
    _assert_recovered(summary, cfg, 2)
    hosts = [e["host"] for e in events if e["event"] == "spare_assigned"]
    assert hosts == [4, 2]  # the spare, then rank 2's repaired host


def test_a_failure_with_no_spare_left_ends_the_run_naming_the_rank() -> None:
    cfg = load_experiment(EXAMPLE)
    prep = prepare(cfg, check_capacity=False)
    sim = build_simulation(prep)
    assert isinstance(sim, FailoverSimulation)
    sim.faults = [Fault("kill", 0, rank=2, at_iteration=1), Fault("kill", 1, rank=1,
                                                                   at_iteration=3)]
    with pytest.raises(SimulationError,
                       match=r"rank 1 failed at .* no spare is left on rail 0"):
        sim.run()


def _stragglar_baseline(tmp_path: Path) -> Path:
    """The example as four data-parallel ranks running StragglAR all-reduces (rank 3 late) on
    electrical rails with one port per rank: a group the K-port budget of circuits would refuse,
    which a packet switch carries."""
    text = EXAMPLE.read_text()
    for old, new in (("{tp: 1, fsdp: 2, pp: 2, fsdp_unit: stage}",
                      "{tp: 1, dp: 4}\n  algorithms: {all_reduce: stragglar}\n"
                      "  stragglers: [{rank: 3, delay_ms: 20}]"),
                     ("mode: provisioning", "mode: baseline"),
                     ("switching_delay: 10", "switching_delay: 10\n  ports_per_rank: 1")):
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "stragglar-failover.yaml"
    path.write_text(text)
    return path


def test_a_baseline_stragglar_job_fails_over_on_one_port_per_rank(tmp_path: Path) -> None:
    """The failed-over job is the same job on the spare's ports: on electrical rails it is
    registered again without the K-port check the first registration skipped, with its
    stages (it was refused with a JobError traceback before)."""
    cfg = load_experiment(_stragglar_baseline(tmp_path))
    prep = prepare(cfg, check_capacity=False)
    sim = build_simulation(prep)
    assert isinstance(sim, FailoverSimulation)
    first = sim.job
    assert not first.check_ports and first.stages
    records, events = sim.run()
    m = compute_metrics(records, events, warmup=cfg.warmup, link_mbps=prep.link_mbps,
                        scale=prep.scale, num_rails=1)
    _rows, keys = failover_keys(prep, records, events, m.iterations)
    _assert_recovered({**m.summary, **keys, "all_iterations_completed":
                       m.summary["iterations_completed"] == cfg.total_iterations}, cfg, 1)
    assert sim.job.job_id == "train-e1" and sim.job.ranks[2].ports != first.ranks[2].ports
    assert not sim.job.check_ports and sim.job.stages == first.stages
    assert sim.job.groups == first.groups


def test_a_job_error_during_a_sim_run_is_one_error_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A job refused mid-run (here the failed-over one, forced) ends the run with exit 1 and an
    ``error:`` line naming the job, never a traceback; the manifest says failed."""

    def refuse(self: FailoverSimulation, *_args: Any) -> None:
        raise JobError("job train-e1: refused for the test")

    monkeypatch.setattr(FailoverSimulation, "_resumed", refuse)
    out = tmp_path / "run"
    assert main(["run", str(_stragglar_baseline(tmp_path)), "--backend", "sim",
                 "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (f"error: {tmp_path / 'stragglar-failover.yaml'}: "
                                    "job train-e1: refused for the test")
    assert json.loads((out / "manifest.json").read_text())["status"] == "failed"


# --- metrics ----------------------------------------------------------------------------------


def _ev(name: str, t_s: float, **fields: Any) -> dict[str, Any]:
    return {"event": name, "t_s": t_s, **fields}


def test_failover_table_splits_recovery_into_its_parts() -> None:
    events = [
        _ev("fault", 10.0, kind="kill", rank=1),
        _ev("failure_detected", 10.05, rank=1, via="exit"),
        _ev("spare_assigned", 10.2, rank=1, rail=0, new_ports=[9], host=4),
        _ev("ranks_resumed", 10.3, rank=1, job="j-e1", epoch=1, start_iteration=2,
            policy="spares", host=4),
        _ev("decision", 10.4, decision=7, job="j-e1"),
        _ev("reconfig_start", 10.4, decision=7, rail=0, ports=[1, 9]),
        _ev("decision", 10.41, decision=8, job="j-e1"),
        _ev("reconfig_start", 10.41, decision=8, rail=0, ports=[2, 3]),  # not the spare's
        _ev("reconfig_end", 10.43, decision=7, rail=0, t_dark_s=10.4, t_light_s=10.425),
        _ev("reconfig_end", 10.45, decision=8, rail=0, t_dark_s=10.41, t_light_s=10.45),
        _ev("collective_done", 10.5, job="j-e1", group="g23", seq=0),  # without rank 1
        _ev("collective_done", 10.6, job="j-e1", group="g01", seq=0),
        _ev("heartbeat_lost", 12.5, job="j", rank=1),
    ]
    (row,) = failover_table(events, {"g01": (0, 1), "g23": (2, 3)})
    assert row["t_first_s"] == 10.6  # the first collective with the failed rank's spare
    assert row["recovery_s"] == pytest.approx(0.6)
    assert row["detection_s"] == pytest.approx(0.05)
    assert row["rewiring_s"] == pytest.approx(0.025)  # decision 7 only: it touched port 9
    assert row["restart_s"] == pytest.approx(0.6 - 0.05 - 0.025)
    assert row["heartbeat_s"] == pytest.approx(2.5)


def test_failover_summary_checks_every_call_after_the_resumption() -> None:
    rows = [{"rank": 1, "policy": "spares", "epoch": 1, "start_iteration": 1,
             "t_fail_s": 1.0, "t_first_s": 1.5, "recovery_s": 0.5, "detection_s": 0.1,
             "rewiring_s": 0.1, "restart_s": 0.3, "heartbeat_s": None}]
    iterations = [{"iteration": 0, "t_start_s": 0.0, "t_end_s": 0.9, "iteration_time_s": 0.9,
                   "measured": True},
                  {"iteration": 1, "t_start_s": 0.9, "t_end_s": 2.0, "iteration_time_s": 1.1,
                   "measured": True},
                  {"iteration": 2, "t_start_s": 2.0, "t_end_s": 2.8, "iteration_time_s": 0.8,
                   "measured": True}]

    def call(rank: int, it: int, epoch: int, received: int = 10) -> dict[str, Any]:
        return {"ev": "call", "rank": rank, "it": it, "epoch": epoch, "expected": 10,
                "received": received}

    records = [call(r, it, 0) for r in (0, 1) for it in (0, 1)]  # iteration 1 aborted...
    records += [call(r, it, 1) for r in (0, 1) for it in (1, 2)]  # ...and run again
    out = failover_summary(rows, iterations, records, {0: 1, 1: 1}, 3)
    assert out["failovers"] == 1 and out["recovery_s"] == 0.5
    assert out["iteration_time_before_s"] == 0.9 and out["iteration_time_after_s"] == 0.8
    assert out["recovery_iteration_times_s"] == [1.1]
    assert out["calls_after_resume"] == out["calls_after_resume_expected"] == 4
    assert out["after_resume_delivered"]
    short = failover_summary(rows, iterations, [*records[:-1], call(1, 2, 1, 9)],
                             {0: 1, 1: 1}, 3)
    assert not short["after_resume_delivered"]
    missing = failover_summary(rows, iterations, records[:-1], {0: 1, 1: 1}, 3)
    assert not missing["after_resume_delivered"] and missing["calls_after_resume"] == 3


def test_an_iteration_run_again_counts_once_from_its_last_epoch() -> None:
    records = [{"ev": "iteration", "rank": r, "it": it, "t_start": t0, "t_end": t1, "epoch": ep}
               for r, it, t0, t1, ep in ((0, 0, 0.0, 1.0, 0), (1, 0, 0.0, 1.0, 0),
                                         (0, 1, 1.0, 1.5, 0),  # rank 0 got through iteration 1
                                         (0, 1, 3.0, 4.0, 1), (1, 1, 3.0, 4.2, 1))]
    rows = iteration_table(records, warmup=0)
    assert [(r["iteration"], r["ranks"], r["t_end_s"]) for r in rows] == [(0, 2, 1.0),
                                                                          (1, 2, 4.2)]
