"""``opus-testbed run`` end to end on real Mininet/OVS: examples/tiny.yaml (4 ranks, 1 rail).

Each test checks the run's own results directory; ``no_leftovers`` checks that the network's
bridges, links and processes are gone afterwards, also after a rank crashed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.emulated.runner import run_emulated
from testbed.errors import RankFailed
from testbed.experiment.config import load_experiment
from testbed.experiment.prepare import prepare
from testbed.plan.phasebarrier import phase_end_calls

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"
FidelityGate = Callable[..., None]


def _prefix(out: Path) -> str:
    return str(json.loads((out / "manifest.json").read_text())["prefix"])


@pytest.mark.parametrize(("mode", "driver"), [("baseline", "emulated"),
                                             ("provisioning", "emulated"),
                                             ("on-demand", "polatis-netconf"),
                                             ("provisioning", "polatis-tl1"),
                                             ("provisioning", "calient-tl1")])
def test_run_end_to_end(mode: str, driver: str, tmp_path: Path, no_leftovers: list[str],
                        fidelity_gate: FidelityGate) -> None:
    """polatis-netconf / polatis-tl1 / calient-tl1: Opus drives the rails through the lab
    driver and the NETCONF / TL1 fronts."""
    cfg = load_experiment(TINY).replace(mode=mode, driver=driver)
    out = tmp_path / f"{mode}-{driver}"
    summary = run_emulated(prepare(cfg), out, say=lambda _m: None)
    no_leftovers.append(_prefix(out))
    assert summary["all_iterations_completed"], summary
    assert summary["iterations_completed"] == cfg.total_iterations
    assert summary["calls"] == summary["calls_delivered"] > 0
    assert summary["bytes_received_scaled"] == summary["bytes_expected_scaled"] > 0
    if mode == "baseline":
        assert summary["reconfigurations"] == 0
    else:
        assert summary["reconfigurations"] > 0
    # windows are the baseline's (a switched run alone has only its own gaps, waits included)
    phases = (("windows.csv", "windows_cdf.png") if mode == "baseline" else ("gaps.csv",))
    for name in ("manifest.json", "summary.json", "controller-events.jsonl", "calls.csv",
                 "iterations.csv", "circuits.csv", "timeline.png", *phases):
        assert (out / name).stat().st_size > 0, name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "done" and manifest["packages"]["opus-testbed"]
    assert manifest["config"]["driver"] == driver
    events = [json.loads(line) for line in (out / "controller-events.jsonl").open()]
    for end in (e for e in events if e["event"] == "reconfig_end"):
        # each switch waits the rail's delay; TL1 sends one command per pair (Polatis) or per
        # connection taken out of or put in service (CALIENT), so there each circuit removed
        # or added is a switch of its own
        changed = len(end["added"]) + len(end["removed"])
        switches = changed if driver.endswith("-tl1") else min(1, changed)
        assert end["dark_ms"] >= switches * cfg.switching_delay_ms - 0.5, end
    # last, once everything else is checked: what must hold under any load (no skip)
    fidelity_gate(summary, out, delay_ms=cfg.switching_delay_ms)


def test_crashed_rank_ends_the_run_cleanly(tmp_path: Path, no_leftovers: list[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPUS_FAULT_CRASH", "2:1")  # rank 2 dies as iteration 1 starts
    cfg = load_experiment(TINY).replace(mode="on-demand")
    out = tmp_path / "crash"
    with pytest.raises(RankFailed) as info:
        run_emulated(prepare(cfg), out, say=lambda _m: None)
    no_leftovers.append(_prefix(out))
    assert info.value.rank == 2
    assert "rank 2 exited with status 7" in str(info.value)
    assert "iteration 0" in str(info.value)  # its last op


def test_rail_state_run_end_to_end(tmp_path: Path, no_leftovers: list[str],
                                   fidelity_gate: FidelityGate) -> None:
    """Rail-state with provisioning on the emulator: the data rail is packet-switched, the bits
    flip on two shadow OCS bridges (each switch at least the delay, in the controller's log and
    the OCS app's), the ranks' plan-based predictions reach the controller, and teardown leaves
    no shadow bridge."""
    cfg = load_experiment(TINY).replace(mode="provisioning", semantics="rail-state",
                                        switching_delay=50.0, wire_check=True)
    out = tmp_path / "rail-state"
    summary = run_emulated(prepare(cfg), out, say=lambda _m: None)
    no_leftovers.append(_prefix(out))  # covers ot<xxx>s<id> bridges and their ports
    assert summary["all_iterations_completed"], summary
    assert summary["calls"] == summary["calls_delivered"] > 0
    assert summary["bytes_received_scaled"] == summary["bytes_expected_scaled"] > 0
    assert (summary["semantics"], summary["ports_per_rank"]) == ("rail-state", 1)
    events = [json.loads(line) for line in (out / "controller-events.jsonl").open()]
    ends = [e for e in events if e["event"] == "reconfig_end"]
    assert {e["rail"] for e in ends} == {1, 2}  # bits 0 and 1 on shadow rails 1 and 2
    assert all(e["dark_ms"] >= cfg.switching_delay_ms - 0.5 for e in ends), ends
    assert any(e["event"] == "speculative_intent" for e in events)  # predictions arrived
    ocs = [json.loads(line) for line in (out / "emulator" / "ocs-events.jsonl").open()]
    assert {e["rail"] for e in ocs if e.get("event") == "light"} == {1, 2}
    # the wire check (on here) watches the shadow rails' ports (veths whose far
    # ends, in the run's shadow namespace, send the probes: emulator.shadowports): it sees
    # their switches, and no frame crosses a circuit that was not commanded (docs/wire.md)
    assert cfg.wire_check
    wire = summary["wire"]
    assert "skipped" not in wire, wire
    commanded = len([e for e in events if e["event"] == "reconfig_start"
                     and (e.get("add") or e.get("remove"))])
    assert wire["commanded"] == commanded > 0
    assert wire["observed"] > 0 and wire["measured"] > 0, wire
    assert wire["non_peer_frames"] == 0 and wire["early"] == 0, wire
    meta = json.loads((out / "wire" / "wire.json").read_text())
    assert {p["rail"] for p in meta["ports"]} == {1, 2}  # the shadow rails only
    assert {p["port"] for p in meta["ports"]} == {1, 2, 3}
    fidelity_gate(summary, out, delay_ms=cfg.switching_delay_ms)


def test_start_gate_holds_every_rank_until_all_loaded(tmp_path: Path, no_leftovers: list[str],
                                                      fidelity_gate: FidelityGate) -> None:
    """``run.start_gate``: from the records, no rank's first op starts before the last rank
    signalled loaded, the runner released once, and every byte arrives."""
    cfg = load_experiment(TINY).replace(mode="on-demand", start_gate=True, iterations=1)
    out = tmp_path / "gate"
    summary = run_emulated(prepare(cfg), out, say=lambda _m: None)
    no_leftovers.append(_prefix(out))
    records = [json.loads(line) for path in sorted((out / "ranks").glob("rank*.jsonl"))
               for line in path.open()]
    gates = {r["rank"]: r for r in records if r["ev"] == "gate"}
    assert sorted(gates) == [0, 1, 2, 3]
    last_loaded = max(g["t_loaded"] for g in gates.values())
    firsts = [min(r["t_intent"] if r["ev"] == "call" else r["t_start"]
                  for r in records if r["rank"] == rank and r["ev"] in ("call", "compute"))
              for rank in gates]
    assert min(firsts) >= last_loaded
    assert all(g["t_go"] >= last_loaded for g in gates.values())
    events = [json.loads(line) for line in (out / "controller-events.jsonl").open()]
    released = [e["t_s"] for e in events if e["event"] == "gate_released"]
    first_intent = min(e["t_s"] for e in events if e["event"] == "intent")
    assert len(released) == 1 and last_loaded <= released[0] <= first_intent
    assert summary["start_gate"]["ranks"] == 4
    assert summary["start_gate"]["ranks_started_early"] == []
    assert summary["all_iterations_completed"]
    fidelity_gate(summary, out, delay_ms=cfg.switching_delay_ms)


def test_phase_barrier_on_demand_end_to_end(tmp_path: Path, no_leftovers: list[str]) -> None:
    """Rail-state on demand with the artifact shim's phase barrier, on the emulator: the run
    completes with every byte, and no call of a rank starts while a phase's last call holds
    its barrier (from that call's ack to its end; :mod:`testbed.plan.phasebarrier`). Every
    rank ran with the barrier (its ``finished`` record counts the starts it held: in this job,
    none need be, as the sim's holds here last no time; tests/testbed/test_replayer_progress.py
    shows a hold)."""
    cfg = load_experiment(TINY).replace(mode="on-demand", semantics="rail-state",
                                        switching_delay=50.0, rail_state_phase_barrier=True)
    prep = prepare(cfg)
    out = tmp_path / "barrier"
    summary = run_emulated(prep, out, say=lambda _m: None)
    no_leftovers.append(_prefix(out))
    assert summary["all_iterations_completed"], summary
    assert summary["calls"] == summary["calls_delivered"] > 0
    assert summary["bytes_received_scaled"] == summary["bytes_expected_scaled"] > 0
    closers = 0
    for rank, ops in prep.plan.programs.items():
        ends = phase_end_calls(ops)
        records = [json.loads(line) for line in (out / "ranks" / f"rank{rank}.jsonl").open()]
        assert [r["barrier_holds"] >= 0 for r in records if r["ev"] == "finished"] == [True]
        calls = [c for c in records if c["ev"] == "call"]
        for c in calls:
            if c["i"] not in ends:
                continue
            closers += 1
            inside = [o["tag"] for o in calls if o is not c
                      and c["t_ack"] + 0.001 < o["t_intent"] < c["t_end"] - 0.001]
            assert not inside, (rank, c["tag"], inside)
    assert closers > 0


@pytest.mark.parametrize("artifact_port", [None, 0], ids=["opus", "artifact-protocol"])
def test_rail_state_ack_timeout_end_to_end(tmp_path: Path, no_leftovers: list[str],
                                           artifact_port: int | None) -> None:
    """Rail-state on demand with ``ocs.rail_state_ack_timeout_s`` on the emulator, over the
    project's protocol and the artifact's: at 2 s per switch and a 0.4 s timeout (model time)
    switching calls go on without their light, each recorded as ``ack_timeout`` then
    ``late_ack`` and counted in its call record, the late ack later than the rank went on; the
    controller completes each such call only after its ack, refuses no completion, and the
    run ends with every byte."""
    timeout_s = 0.4
    cfg = load_experiment(TINY).replace(mode="on-demand", semantics="rail-state",
                                        switching_delay=2000.0, iterations=1, warmup=1,
                                        rail_state_ack_timeout_s=timeout_s,
                                        artifact_port=artifact_port)
    out = tmp_path / "ack-timeout"
    summary = run_emulated(prepare(cfg), out, say=lambda _m: None)
    no_leftovers.append(_prefix(out))
    assert summary["all_iterations_completed"], summary
    assert summary["calls"] == summary["calls_delivered"] > 0
    assert summary["bytes_received_scaled"] == summary["bytes_expected_scaled"] > 0
    k = float(json.loads((out / "manifest.json").read_text()).get("time_dilation") or 1.0)
    records = [json.loads(line) for path in sorted((out / "ranks").glob("rank*.jsonl"))
               for line in path.open()]
    went_on = {(r["rank"], r["group"], r["seq"]): r for r in records if r["ev"] == "ack_timeout"}
    late = {(r["rank"], r["group"], r["seq"]): r for r in records if r["ev"] == "late_ack"}
    # every late ack answers a call that went on; over the artifact protocol a rank's last
    # timed-out call may end the run before its late ack is read (CI 2026-12-07, 1 of 2
    # protocol runs: rank 3's last p2p call): at most one missing per rank, a known gap
    assert went_on and set(late) <= set(went_on)
    ranks = {key[0] for key in went_on}
    missing_allowed = len(ranks) if artifact_port is not None else 0
    assert len(went_on) - len(late) <= missing_allowed, (went_on, late)
    assert all(late[key]["t"] > went_on[key]["t"] for key in late)
    calls = [r for r in records if r["ev"] == "call"]
    assert sum(c.get("ack_timeouts", 0) for c in calls) == len(went_on)
    for c in calls:
        if c.get("ack_timeouts"):  # it waited the timeout (wall: k times it), not the light
            assert timeout_s * k - 0.05 <= c["t_ack"] - c["t_intent"] < 2.0 * k
    events = [json.loads(line) for line in (out / "controller-events.jsonl").open()]
    assert not [e for e in events if e["event"] == "error"], events
    acked = {(e["rank"], e["group"], e["seq"]): e["t_s"] for e in events if e["event"] == "ack"}
    done = {(e["rank"], e["group"], e["seq"]): e["t_s"] for e in events
            if e["event"] == "complete"}
    for key in late:  # the completion waited for the late ack
        assert done[key] >= acked[key]

