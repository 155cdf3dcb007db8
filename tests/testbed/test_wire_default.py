"""The wire check is on by default for emulated OCS runs (issue 37); a switched run without a
capture says why and that the wire saw none of its switches, never passing for checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.emulated import runner
from testbed.emulated.runner import rail_spec, wire_skip_reason, wire_skipped
from testbed.experiment.config import load_experiment
from testbed.metrics.wire import wire_text

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.yaml"

#: two commanded switches on shadow rails 1 and 2, as a rail-state run's controller logs them
EVENTS = [
    {"event": "reconfig_start", "decision": 1, "rail": 1, "t_s": 1.0, "add": [[1, 2]],
     "remove": [[1, 3]]},
    {"event": "reconfig_end", "decision": 1, "rail": 1, "t_s": 1.06},
    {"event": "reconfig_start", "decision": 1, "rail": 2, "t_s": 1.0, "add": [[1, 3]],
     "remove": [[1, 2]]},
    {"event": "reconfig_end", "decision": 1, "rail": 2, "t_s": 1.06},
]


def test_the_wire_check_is_off_unless_asked_and_judges_an_emulated_ocs_run_when_on() -> None:
    assert load_experiment(TINY).wire_check is False  # (docs/wire.md: its CPU on 2 cores)
    cfg = load_experiment(TINY).replace(mode="on-demand", wire_check=True)
    spec = rail_spec(cfg, 2, 2, 8.0)
    assert wire_skip_reason(cfg, spec) is None
    off = cfg.replace(wire_check=False)
    assert wire_skip_reason(off, spec) == "run.wire_check is off"
    assert wire_text(wire_skipped(off, spec, EVENTS)) == (
        "not checked: 0 of 2 switches seen on the wire; run.wire_check is off")


def test_a_baseline_has_no_capture_and_no_wire_record() -> None:
    cfg = load_experiment(TINY).replace(mode="baseline", wire_check=True)
    spec = rail_spec(cfg, 2, 2, 8.0)
    assert wire_skip_reason(cfg, spec) == "no OCS rail to observe (electrical rails)"
    assert wire_skipped(cfg, spec, []) is None


def test_rail_state_is_wire_checked_on_its_shadow_rails() -> None:
    """Rail-state's switches happen on shadow rails, whose ports are now veths the capture
    watches (emulator.shadowports): no reason to skip."""
    cfg = load_experiment(TINY).replace(mode="provisioning", semantics="rail-state",
                                        wire_check=True)
    spec = rail_spec(cfg, 2, 2, 8.0, shadow_rails=2)
    assert spec.mode != "ocs" and len(spec.shadow_ids) == 2
    assert wire_skip_reason(cfg, spec) is None
    assert wire_skipped(cfg, spec, EVENTS) is None
    off = cfg.replace(wire_check=False)
    assert wire_text(wire_skipped(off, spec, EVENTS)) == (
        "not checked: 0 of 2 switches seen on the wire; run.wire_check is off")


def test_without_tcpdump_the_run_goes_on_without_the_capture_saying_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner.shutil, "which", lambda _name: None)
    cfg = load_experiment(TINY).replace(mode="on-demand", wire_check=True)
    spec = rail_spec(cfg, 2, 2, 8.0)
    reason = wire_skip_reason(cfg, spec)
    assert reason is not None and "tcpdump is not installed" in reason
    assert "tcpdump is not installed" in wire_text(wire_skipped(cfg, spec, EVENTS))


def test_the_demo_gives_each_switched_rows_wire_figures() -> None:
    from testbed.cli.experiments import demo_lines
    from testbed.studies.demo import DEMO_RUNS

    checked = {"switches": 140, "measured": 90, "observed": 140, "commanded": 142,
               "error_ms": {"count": 90, "p50": 0.31, "p99": 1.2, "max": 1.4},
               "resolution_ms": {"p50": 1.7}, "app_minus_wire_ms": {"count": 90, "p50": 0.4,
                                                                    "p99": 1.1},
               "early": 0, "non_peer_frames": 0, "lost_frames": 3, "problems": []}
    shadow = {**checked, "switches": 72, "observed": 72, "commanded": 72, "measured": 64}
    runs: dict[str, dict[str, object]] = {}
    for label, _mode, semantics in DEMO_RUNS:  # rail-state: its shadow rails are captured
        wire = (None if label == "baseline" else
                shadow if semantics == "rail-state" else checked)
        runs[label] = {"iteration_time_s": 2.0, "fidelity": "ok", "wire": wire}
    lines = demo_lines("== demo ==", runs, {}, 100.0)  # type: ignore[arg-type]
    wire = {line.split(":")[0]: line for line in lines if line.startswith("wire ")}
    assert "wire baseline" not in wire
    assert ("saw 140 of 142 switches, 90 dark periods measured, error p50 +0.31 ms, p99 "
            "+1.20 ms, max +1.40 ms") in wire["wire on-demand"]
    assert "app - wire p50 +0.40 ms, p99 +1.10 ms" in wire["wire on-demand"]
    assert "saw 72 of 72 switches, 64 dark periods measured" in wire["wire rail-state on-demand"]
    assert len(wire) == len(DEMO_RUNS) - 1


def test_a_shadow_rail_is_judged_against_its_data_rails_delay() -> None:
    """With per-rail delays, the shadow rails of rail r (ids past the data rails) expect r's
    delay on the wire and in the app's record, not the base one."""
    from dataclasses import replace

    from testbed.emulated.runner import expected_delay

    cfg = load_experiment(TINY).replace(mode="provisioning", semantics="rail-state")
    spec = replace(rail_spec(cfg, 2, 2, 8.0, shadow_rails=4), per_rail_delay={1: 30.0})
    expected = expected_delay(cfg, spec)
    # data rails 0, 1; shadow rails 2, 3 (rail 0's two bits) and 4, 5 (rail 1's)
    assert [expected.base(r) for r in range(6)] == [
        cfg.switching_delay_ms, 30.0, cfg.switching_delay_ms, cfg.switching_delay_ms, 30.0, 30.0]
