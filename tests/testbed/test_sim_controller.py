"""The Opus modes on the sim engine: exact ack waits, provisioning, mispredictions, degree.

Four single-GPU servers share rail 0. Each iteration every rank exchanges with its DP partner
(``dp``: pairs 0-1, 2-3), computes for a window, exchanges with its PP partner (``pp``: pairs
0-2, 1-3) and computes again; each phase is one group, so one decision switches the rail. The
fabric has no fixed costs unless a test sets them, so times are exact.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from sim_programs import Programs, simulation

from controller.job import CommGroup
from controller.profile import CallProfile, CallSignature
from testbed.plan.replay import PlanOp
from testbed.simulator.engine import PlanSimulation
from testbed.simulator.network import IDEAL_COSTS, NetworkModel, network_model

DP = CommGroup("dp", "dp", (0, 1, 2, 3), pairs=((0, 1), (2, 3)))
PP = CommGroup("pp", "pp", (0, 1, 2, 3), pairs=((0, 2), (1, 3)))
TP = CommGroup("tp", "tp", (0, 1, 2, 3), pairs=((0, 3), (1, 2)))  # never called
DELAY_MS = 25.0
CHUNK_BYTES = 125_000  # 1 ms at 1 Gbit/s
IDEAL = network_model(1000, 5, IDEAL_COSTS)
CALLS_PER_ITERATION = 2 * 4  # dp and pp at each of the 4 ranks


def dp_pp(window_s: float) -> dict[int, list[PlanOp]]:
    progs = Programs(range(4)).call(DP, CHUNK_BYTES)
    for r in range(4):
        progs.compute(r, window_s)
    progs.call(PP, CHUNK_BYTES)
    for r in range(4):
        progs.compute(r, window_s)
    return progs.ops


def run(window_s: float, mode: str, *, k: int = 1, iterations: int = 4,
        network: NetworkModel = IDEAL) -> tuple[PlanSimulation, list[dict[str, Any]]]:
    sim = simulation(dp_pp(window_s), [DP, PP, TP], network=network, mode=mode,
                     switching_delay_ms=DELAY_MS, iterations=iterations, ports_per_rank=k)
    records, _events = sim.run()
    calls = [r for r in records if r["ev"] == "call"]
    assert len(calls) == CALLS_PER_ITERATION * iterations
    assert all(c["received"] == c["expected"] == CHUNK_BYTES for c in calls)
    return sim, calls


def waits_s(calls: list[dict[str, Any]], iteration: int | None = None) -> list[float]:
    """Intent -> ack of every call (of one iteration)."""
    return [c["t_ack"] - c["t_intent"] for c in calls if iteration in (None, c["it"])]


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("mode", ["on-demand", "provisioning", "degree-aware"])
def test_dp_pp_runs_clean(k: int, mode: str) -> None:
    """Every call is acknowledged once and delivers its bytes; the engine checked the
    invariants on every request, ack and completion."""
    sim, _calls = run(0.05, mode, k=k)
    assert sim.core.counters["acks"] == CALLS_PER_ITERATION * 4


def test_ack_wait_is_the_switching_delay_plus_the_fixed_costs() -> None:
    """On demand every call switches once: an intent travels to the controller, the rail
    switches, the driver reports the light, the ack travels back."""
    control_s, overhead_s = 1e-3, 4e-3
    net = NetworkModel(link_bps=1e9, latency_s=5e-6, control_s=control_s, connect_s=2e-3,
                       step_s=3e-4, finish_s=5e-4, switch_overhead_s=overhead_s)
    _sim, calls = run(0.05, "on-demand", iterations=3, network=net)
    expected_s = DELAY_MS / 1e3 + overhead_s + 2 * control_s
    assert statistics.median(waits_s(calls)) == pytest.approx(expected_s, abs=1e-12)
    assert waits_s(calls) == pytest.approx([expected_s] * len(calls), abs=1e-12)


def test_provisioning_hides_switching_when_the_window_is_longer() -> None:
    window_s = 0.05
    _sim, on_demand = run(window_s, "on-demand")
    assert waits_s(on_demand) == pytest.approx([DELAY_MS / 1e3] * len(on_demand), abs=1e-12)
    sim, prov = run(window_s, "provisioning")
    # iteration 0 is profiled; iteration 1's first call cannot be predicted yet (its
    # predecessor ended iteration 0); from then on every switch happens inside a window
    first_of_1 = [w for c, w in zip(prov, waits_s(prov), strict=True)
                  if c["it"] == 1 and c["lane"] == "dp"]
    assert first_of_1 == pytest.approx([DELAY_MS / 1e3] * 4, abs=1e-12)
    later = [w for c, w in zip(prov, waits_s(prov), strict=True)
             if c["it"] >= 2 or (c["it"] == 1 and c["lane"] == "pp")]
    assert later == pytest.approx([0.0] * len(later), abs=1e-12)
    # 2 on-demand decisions in iteration 0, 1 in iteration 1; speculative: pp of iteration 1,
    # both calls of iterations 2 and 3, and the dp of an iteration 4 that never comes
    assert sim.core.counters["decisions"] == 9
    assert sim.core.counters["speculative_decisions"] == 6


def test_a_window_shorter_than_the_switch_hides_part_of_it() -> None:
    window_s = 0.01
    _sim, calls = run(window_s, "provisioning")
    later = waits_s(calls, 2) + waits_s(calls, 3)
    assert later == pytest.approx([DELAY_MS / 1e3 - window_s] * len(later), abs=1e-12)


def test_misprediction_falls_back_to_on_demand_safely(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every prediction names ``tp``: each speculative switch is wasted, and with a window
    longer than the switch no call waits more than on demand."""
    predict = CallProfile.predict_next

    def liar(profile: CallProfile) -> CallSignature | None:
        return None if predict(profile) is None else CallSignature("tp", "all_gather", 1, "tp")

    monkeypatch.setattr(CallProfile, "predict_next", liar)
    for k in (1, 2):
        sim, calls = run(0.05, "provisioning", k=k)
        assert waits_s(calls) == pytest.approx([DELAY_MS / 1e3] * len(calls), abs=1e-12)
        counters = sim.core.counters
        assert counters["decisions"] == 8 + 6  # every call on demand, plus 6 wasted switches
        assert counters["speculative_decisions"] == 6
        # each rank predicts after its 6 calls of iterations 1-3; its next real intent
        # cancels the prediction, except after the very last call
        assert counters["mispredictions"] == 4 * 5


@pytest.mark.parametrize(("k", "mode", "decisions", "avoided"), [
    (1, "on-demand", 10, 0), (1, "degree-aware", 10, 0),  # one port: every phase switches
    (2, "on-demand", 10, 0),  # base mode: a phase removes the other parallelism's circuits
    (2, "degree-aware", 2, 8),  # both pairs lit once, then kept: 10 - 2 activations avoided
])
def test_degree_aware_avoids_reconfiguration_where_ports_allow(
        k: int, mode: str, decisions: int, avoided: int) -> None:
    sim, _calls = run(0.05, mode, k=k, iterations=5)
    assert sim.core.counters["decisions"] == decisions
    assert sim.core.counters["avoided_reconfigurations"] == avoided
