"""The wire check's own cost, reported beside its figures (issue 37): its cores and the probe
sender's frames, from the run's CPU breakdown and the capture's record."""

from __future__ import annotations

from testbed.metrics.wire import cost_text, wire_cost, wire_text

CPU = {"component_cores_mean": {"wire check": 0.3, "ovs-vswitchd r0": 0.15,
                                "ovs-vswitchd r1": 0.16, "ranks": 0.12}}
WIRE = {"switches": 4, "measured": 2, "observed": 4, "commanded": 4,
        "error_ms": {"count": 0}, "app_minus_wire_ms": {"count": 0}, "early": 0,
        "non_peer_frames": 0, "lost_frames": 0, "probe_interval_ms": 2.0}


def test_the_cost_is_the_checks_cores_and_the_switches_beside_them() -> None:
    assert wire_cost(CPU) == {"wire_check_cores": 0.3, "vswitchd_cores": 0.31}


def test_a_run_without_the_check_in_its_breakdown_has_no_cost() -> None:
    assert wire_cost({"component_cores_mean": {"ranks": 0.1}}) is None
    assert wire_cost(None) is None


def test_the_wire_line_ends_with_the_checks_cost() -> None:
    wire = {**WIRE, "cost": wire_cost(CPU), "probe_frames": {"sent": 900, "skipped": 100}}
    text = wire_text(wire)
    assert text.endswith("; check's cost: 0.30 cores (tcpdump + probe sender; the vswitchds, "
                         "which forward the probes, 0.31), 900 probes sent (every 2 ms a "
                         "port), 100 skipped on ports busy with data")


def test_a_line_without_cost_figures_says_nothing_of_cost() -> None:
    assert cost_text(WIRE) == ""
    assert "cost" not in wire_text(WIRE)
