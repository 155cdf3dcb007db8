"""Spare-GPU failover and fault injection end to end on real Mininet/OVS.

examples/failover.yaml: the tiny job (four ranks on one rail) with a spare server. Each test
checks its own results directory and that nothing of the run is left afterwards
(``no_leftovers``: bridges, interfaces, processes, records), also when the run fails.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testbed.emulated.runner import run_emulated
from testbed.errors import RankFailed
from testbed.experiment.config import ExperimentConfig, load_experiment
from testbed.experiment.faults import FailoverSettings, Fault
from testbed.experiment.prepare import prepare

FAILOVER = Path(__file__).resolve().parents[2] / "examples" / "failover.yaml"
FidelityGate = Callable[..., None]


def _prefix(out: Path) -> str:
    return str(json.loads((out / "manifest.json").read_text())["prefix"])


def _events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "controller-events.jsonl").open()]


def _run(cfg: ExperimentConfig, out: Path, no_leftovers: list[str]) -> dict[str, Any]:
    try:
        return run_emulated(prepare(cfg), out, say=lambda _m: None)
    finally:
        if (out / "manifest.json").exists():
            no_leftovers.append(_prefix(out))


def _recoveries(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's recoveries from failures (a rank too starved of CPU to send heartbeats
    makes every rank resume in place: not a failure, left out)."""
    return [r for r in summary["recovery"] if r["policy"] != "in_place"]


def _assert_resumed_fully(summary: dict[str, Any]) -> None:
    assert summary["all_iterations_completed"], summary
    assert summary["after_resume_delivered"], summary
    assert summary["calls_after_resume"] == summary["calls_after_resume_expected"] > 0
    assert (summary["bytes_after_resume_received"] == summary["bytes_after_resume_expected"]
            > 0)
    assert summary["calls"] == summary["calls_delivered"]


def test_a_killed_rank_moves_to_the_spare_and_the_run_completes(
        tmp_path: Path, no_leftovers: list[str], fidelity_gate: FidelityGate) -> None:
    cfg = load_experiment(FAILOVER).replace(wire_check=True)
    out = tmp_path / "failover"
    summary = _run(cfg, out, no_leftovers)
    assert summary["failovers"] == 1 and summary["restarts"] == 0
    _assert_resumed_fully(summary)
    (row,) = _recoveries(summary)
    assert (row["rank"], row["host"], row["via"], row["fault"]) == (2, 4, "exit", "kill")
    assert 0 <= row["detection_s"] < 1.0 and row["rewiring_s"] > 0
    assert row["recovery_s"] == pytest.approx(
        row["detection_s"] + row["rewiring_s"] + row["restart_s"])
    events = _events(out)
    fault = next(i for i, e in enumerate(events) if e["event"] == "fault")
    times = [next(e["t_s"] for e in events[fault:] if e["event"] == name) for name in (
        "fault", "failure_detected", "epoch_aborted", "spare_assigned", "ranks_resumed")]
    assert times == sorted(times)  # every step logged, in order
    records = [json.loads(line) for line in (out / "ranks" / "rank2.jsonl").open()]
    assert any(r["ev"] == "takeover" and r["host"] == 4 for r in records)
    assert any(r["ev"] == "call" and r.get("epoch") == 1 for r in records)  # on the spare
    assert (out / "failover0.png").stat().st_size > 0
    # the wire watched the ranks' and the spares' ports, followed rank 2 onto the spare's,
    # and saw no frame at a non-peer across the takeover
    wire = summary["wire"]
    assert wire["ports"] == wire["ports_seen"] > 4, wire
    assert wire["ports_taken_over"] == 1, wire
    assert wire["non_peer_frames"] == 0, wire
    assert wire["observed"] > 0, wire
    fidelity_gate(summary, out, delay_ms=cfg.switching_delay_ms)


def test_without_spares_every_rank_restarts_from_the_last_iteration(
        tmp_path: Path, no_leftovers: list[str], fidelity_gate: FidelityGate) -> None:
    cfg = load_experiment(FAILOVER).replace(no_spares=True)
    out = tmp_path / "no-spares"
    summary = _run(cfg, out, no_leftovers)
    assert summary["failovers"] == 0 and summary["restarts"] == 1
    _assert_resumed_fully(summary)
    assert json.loads((out / "manifest.json").read_text())["spares"] == 0
    assert not any(e["event"] == "spare_assigned" for e in _events(out))
    fidelity_gate(summary, out, delay_ms=cfg.switching_delay_ms)


def test_cut_links_a_hung_rank_and_a_failed_ocs_port_each_take_a_spare(
        tmp_path: Path, no_leftovers: list[str], fidelity_gate: FidelityGate) -> None:
    """link_down: the rank's NIC watchdog sees no carrier; hang: only its heartbeats tell;
    port_failed: the OCS port goes dark and refuses circuits, and its rank moves off it."""
    base = load_experiment(FAILOVER)
    cfg = base.replace(spare_servers=3, iterations=6, faults=(
        Fault("link_down", 0, rank=1, at_iteration=2),
        Fault("hang", 1, rank=0, at_iteration=3),
        Fault("port_failed", 2, rail=0, port=4, at_iteration=5)),
        failover=FailoverSettings(heartbeat_timeout_s=1.5))
    out = tmp_path / "links"
    summary = _run(cfg, out, no_leftovers)
    assert summary["failovers"] == 3
    _assert_resumed_fully(summary)
    rows = _recoveries(summary)
    assert [(r["rank"], r["fault"], r["via"]) for r in rows] == [
        (1, "link_down", "exit"), (0, "hang", "heartbeat"), (3, "port_failed", "exit")]
    assert rows[1]["detection_s"] >= 1.5  # the heartbeat timeout
    events = _events(out)
    assert any(e["event"] == "fault" and e.get("kind") == "nic_down" for e in events)
    t_port = next(e["t_s"] for e in events if e["event"] == "fault"
                  and e.get("kind") == "port_failed")
    # a switch already under way when the port fails may still light it (the emulated OCS
    # finishes a switch it has started); none requested after the failure may
    assert not any(4 in c for e in events if e["event"] == "reconfig_end"
                   and e["t_request_s"] > t_port for c in e["added"]), \
        "a circuit requested after the failure lit the FAILED port"
    asked = {e["decision"] for e in events if e["event"] == "reconfig_start"
             and e["t_s"] > t_port and any(4 in c for c in e["add"])}
    refused = {e["decision"] for e in events if e["event"] == "reconfig_failed"
               and "port 4 is FAILED" in e["error"]}
    assert asked <= refused  # the old job may ask before its rank is found failed: refused
    fidelity_gate(summary, out, delay_ms=cfg.switching_delay_ms)


def test_refused_and_jittery_switching_are_survived(
        tmp_path: Path, no_leftovers: list[str], fidelity_gate: FidelityGate) -> None:
    # at k = 1: the OCS app's records below are read on the wall clock, where a dilated run's
    # delays are k times the configured ones
    cfg = load_experiment(FAILOVER).replace(mode="on-demand", time_dilation=1, faults=(
        Fault("refuse", 0, count=2, at_iteration=1), Fault("jitter", 1, jitter_ms=4.0)))
    out = tmp_path / "refuse"
    summary = _run(cfg, out, no_leftovers)
    assert summary["all_iterations_completed"] and summary["failovers"] == 0
    assert summary["calls"] == summary["calls_delivered"]
    assert summary["reconfigurations_refused"] == 2
    assert summary["call_retries"] >= 2
    ocs_log = [json.loads(line) for line in (out / "emulator" / "ocs-events.jsonl").open()]
    injected = [e["delay_ms"] for e in ocs_log if e["event"] == "dark"]
    assert len(injected) == summary["reconfigurations"]
    assert all(6.0 <= d <= 14.0 for d in injected)  # the 10 ms base +- 4 ms
    assert max(injected) - min(injected) > 2.0, "the delays did not jitter"
    dark = [e["dark_ms"] for e in _events(out) if e["event"] == "reconfig_end"]
    assert min(dark) >= 6.0 - 0.5  # light never came back before the injected delay
    fidelity_gate(summary, out, delay_ms=cfg.switching_delay_ms, jitter_ms=4.0)


def test_a_failure_with_no_spare_left_ends_the_run_naming_the_rank(
        tmp_path: Path, no_leftovers: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPUS_FAULT_CRASH", "1:4")  # unplanned: after the spare is taken
    cfg = load_experiment(FAILOVER)
    with pytest.raises(RankFailed) as info:
        _run(cfg, tmp_path / "no-spare-left", no_leftovers)
    assert info.value.rank == 1
    assert "rank 1 exited with status 7" in str(info.value)
    assert "no spare is left on rail 0 to take rank 1 over" in str(info.value)
