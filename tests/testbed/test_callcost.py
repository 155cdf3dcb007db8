"""The emulator's per-call costs, measured from the ranks' records, and their verdict."""

from __future__ import annotations

import pytest

from testbed.metrics.callcost import (
    ITERATION_LIMIT_PCT,
    OVERHEAD_LIMIT_PTS,
    call_cost_bound,
    overhead_effect_pts,
    overhead_exceeded,
)
from testbed.metrics.fidelity import RunEvidence, judge

LINK_MBPS, SCALE = 8.0, 1e-3  # 1 MB of model bytes -> 1 kB -> 1 ms on the wire (short)


def _call(rank: int, it: int, t0: float, *, ctl_s: float, extra_s: float, nbytes: int,
          kind: str = "all_gather", reconfigured: bool = False) -> dict[str, object]:
    wire_s = nbytes * SCALE * 8 / (LINK_MBPS * 1e6)
    return {"ev": "call", "rank": rank, "it": it, "kind": kind, "wire_bytes": nbytes,
            "reconfigured": reconfigured, "t_intent": t0, "t_ack": t0 + ctl_s,
            "t_end": t0 + ctl_s + wire_s + extra_s}


def _records(ctl_s: float = 0.5e-3, extra_s: float = 1e-3) -> list[dict[str, object]]:
    recs = []
    for it in range(3):
        for rank in range(2):
            for i in range(4):  # four short calls, one long one that switched
                recs.append(_call(rank, it, it + i * 0.01, ctl_s=ctl_s, extra_s=extra_s,
                                  nbytes=1000))
            recs.append(_call(rank, it, it + 0.05, ctl_s=0.03, extra_s=0.2, nbytes=10**7,
                              kind="reduce_scatter", reconfigured=True))
    return recs


def test_the_bound_charges_every_call_with_the_short_calls_medians() -> None:
    b = call_cost_bound(_records(), warmup=1, link_mbps=LINK_MBPS, scale=SCALE,
                        iteration_s=0.5)
    assert b is not None
    assert b.control_ms == pytest.approx(0.5)  # the switched call's 30 ms are not control
    assert b.excess_ms == pytest.approx({"all_gather": 1.0})  # the long call is not short
    assert b.calls_per_iteration == 5
    # 5 calls x 0.5 ms control + 5 x 1 ms transport (the long one pays the pooled median)
    assert b.per_iteration_s == pytest.approx(7.5e-3)
    assert b.iteration_pct == pytest.approx(1.5)
    assert b.exceeded() is None
    assert b.to_summary()["iteration_limit_pct"] == ITERATION_LIMIT_PCT


def test_costs_past_the_limit_degrade_the_run_and_say_what_shrinks_them() -> None:
    b = call_cost_bound(_records(ctl_s=5e-3, extra_s=10e-3), warmup=0, link_mbps=LINK_MBPS,
                        scale=SCALE, iteration_s=0.5)
    assert b is not None and b.iteration_pct is not None
    assert b.iteration_pct > ITERATION_LIMIT_PCT
    text = b.exceeded()
    assert text is not None and "time dilation" in text
    verdict = judge(RunEvidence(cpu={"machine_cpu_mean_pct": 30.0}, calls=1, calls_delivered=1,
                                call_cost=b))
    assert verdict.fidelity == "degraded"
    assert any("per-call costs" in r.text and r.timing for r in verdict.reasons)


def test_no_calls_no_bound() -> None:
    assert call_cost_bound([], warmup=0, link_mbps=8.0, scale=1.0, iteration_s=1.0) is None
    unacked = {"ev": "call", "it": 0, "t_intent": None, "t_ack": None, "t_end": None}
    assert call_cost_bound([unacked], warmup=0, link_mbps=8.0, scale=1.0,
                           iteration_s=1.0) is None  # a torch job's scale-up call


def test_the_overhead_carries_the_difference_of_the_two_runs_bounds() -> None:
    run = {"call_cost_bound": {"per_iteration_s": 0.030}}
    base = {"call_cost_bound": {"per_iteration_s": 0.020}, "iteration_time_s": 2.0}
    assert overhead_effect_pts(run, base) == pytest.approx(0.5)
    assert overhead_exceeded(0.5) is None
    assert overhead_exceeded(OVERHEAD_LIMIT_PTS + 0.1) is not None
    assert overhead_effect_pts(run, {"iteration_time_s": 2.0}) is None


def test_the_control_round_trip_is_read_from_the_controllers_records() -> None:
    """The intent's way there and the ack's way back; the controller's wait between them (for
    light, for the group's other members) is the model's, not the emulator's cost."""
    recs = [dict(_call(0, 1, 10.0, ctl_s=0.1, extra_s=1e-3, nbytes=1000), lane="g", seq=3)]
    events = [{"event": "intent", "rank": 0, "group": "g", "seq": 3, "t_s": 10.0004},
              {"event": "ack", "rank": 0, "group": "g", "seq": 3, "t_s": 10.0994}]
    b = call_cost_bound(recs, warmup=1, link_mbps=LINK_MBPS, scale=SCALE, iteration_s=1.0,
                        events=events)
    assert b is not None and b.control_ms == pytest.approx(1.0)  # 0.4 + 0.6 ms, not 100
