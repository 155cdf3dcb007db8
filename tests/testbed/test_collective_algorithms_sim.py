"""Collective algorithms on the sim backend: times against hand-computed ones (IDEAL costs).

One collective per iteration over every rank of one rail (:mod:`workloads.micro`), a rail rate
of R = 8 Mbit/s (byte scale 1) and a hop latency of 50 us, no fixed costs: a transfer of ``b``
bytes takes ``LAT + 8 b / R``. ``M`` is an all-to-all block, ``D`` the switching delay; a
collective's time runs from its last member's intent (or its straggler's) to its last end.
"""

from __future__ import annotations

from typing import Any

import pytest

from testbed.experiment.config import ExperimentConfig
from testbed.experiment.prepare import prepare
from testbed.simulator.network import IDEAL_COSTS, network_model
from testbed.simulator.run import simulate_plan
from workloads.config import Straggler
from workloads.hardware import Cluster
from workloads.micro import collective_schedule

R_BPS = 8e6
LAT_S = 50e-6
M = 20_000  # bytes per all-to-all block
S = 840_000  # all-reduce buffer


def xfer(n_bytes: float) -> float:
    return LAT_S + 8 * n_bytes / R_BPS


def simulate(kind: str, n: int, size: int, algorithm: str, *, mode: str, k: int,
             delay_ms: float = 0.0, straggler: tuple[int, float] | None = None
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Calls of the measured iteration (the second) and the controller's events."""
    stragglers = (Straggler(*straggler),) if straggler else ()
    sched = collective_schedule(Cluster(n, 1), kind, size, gap_s=1e-3,
                                algorithms=((kind, "", algorithm),), stragglers=stragglers)
    cfg = ExperimentConfig(workload=sched.config, mode=mode, switching_delay=delay_ms,
                           ports_per_rank=k, rail_gbps=R_BPS / 1e9, link_mbps=R_BPS / 1e6,
                           latency_us=LAT_S * 1e6, iterations=1, warmup=1)
    prep = prepare(cfg, check_capacity=False, schedule=sched)
    records, events = simulate_plan(prep, network=network_model(R_BPS / 1e6, LAT_S * 1e6,
                                                                IDEAL_COSTS))
    return [r for r in records if r["ev"] == "call" and r["it"] == 1], events


def span(calls: list[dict[str, Any]], start: str = "last") -> float:
    """From the last member's intent (``start="last"``) or the first's to the last end."""
    t0 = [float(c["t_intent"]) for c in calls]
    return max(float(c["t_end"]) for c in calls) - (max(t0) if start == "last" else min(t0))


def decisions(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if e.get("event") == "decision")


@pytest.mark.parametrize(("k", "segments"), [(1, 3), (2, 2)])
def test_matchings_switch_once_per_segment(k: int, segments: int) -> None:
    """N = 4: three rounds of one block each way; K ports carry K rounds per switch."""
    calls, _ = simulate("all_to_all", 4, 4 * M, "matchings", mode="on-demand", k=k,
                        delay_ms=10.0)
    assert span(calls) == pytest.approx(segments * 0.010 + 3 * xfer(M), abs=1e-9)
    assert {c["segments"] for c in calls} == {segments}
    assert all(c["received"] == c["expected"] == 3 * M for c in calls)


def test_electrical_all_to_all_needs_no_port_per_peer() -> None:
    """The pairwise exchange's full mesh on electrical rails at K = 1: no port budget."""
    for algorithm in ("pairwise", "matchings"):
        calls, events = simulate("all_to_all", 4, 4 * M, algorithm, mode="baseline", k=1)
        assert span(calls) == pytest.approx(3 * xfer(M), abs=1e-9)
        assert decisions(events) == 0


@pytest.mark.parametrize(("n", "blocks"), [(4, 2), (8, 8)])
def test_multihop_over_the_lit_ring_takes_n_squared_over_8_blocks(n: int, blocks: int) -> None:
    """Once the ring is lit (the warm-up lit it), floor(n/2) steps and n^2/8 blocks per link."""
    calls, _events = simulate("all_to_all", n, n * M, "multihop", mode="on-demand", k=2,
                              delay_ms=25.0)
    assert span(calls) == pytest.approx(n // 2 * LAT_S + blocks * 8 * M / R_BPS, abs=1e-9)
    assert not any(c["reconfigured"] for c in calls)


def test_stragglar_of_four_after_the_straggler_arrives() -> None:
    """n = 4, straggler 3 late by 1 s (more than the reduce-scatter's 2 steps of S/3): four
    rounds of S/3 from its arrival, against the ring's six steps of S/4."""
    calls, _ = simulate("all_reduce", 4, S, "stragglar", mode="baseline", k=1,
                        straggler=(3, 1.0))
    arrival = next(float(c["t_intent"]) for c in calls if c["rank"] == 3)
    end = max(float(c["t_end"]) for c in calls)
    assert end - arrival == pytest.approx(4 * xfer(S / 3), abs=1e-9)
    ring, _ = simulate("all_reduce", 4, S, "ring", mode="baseline", k=1, straggler=(3, 1.0))
    assert span(ring) == pytest.approx(6 * xfer(S / 4), abs=1e-9)
    assert all(c["received"] == c["expected"] for c in calls + ring)


def test_stragglar_without_delay_runs_both_phases() -> None:
    calls, _ = simulate("all_reduce", 4, S, "stragglar", mode="baseline", k=1,
                        straggler=(3, 0.0))
    assert span(calls, "first") == pytest.approx(6 * xfer(S / 3), abs=1e-9)


def test_stragglar_of_eight_on_electrical_rails_takes_nine_rounds() -> None:
    """n - 2 + log2 n = 9 rounds of S/7. Sync rounds make it so: without the rendezvous a
    rank idle in a round sends the next round's chunk early and shares its receiver's port."""
    calls, _ = simulate("all_reduce", 8, S, "stragglar", mode="baseline", k=2,
                        straggler=(7, 1.0))
    arrival = next(float(c["t_intent"]) for c in calls if c["rank"] == 7)
    assert max(float(c["t_end"]) for c in calls) - arrival == pytest.approx(
        9 * xfer(S / 7), abs=1e-9)
    ring, _ = simulate("all_reduce", 8, S, "ring", mode="baseline", k=2, straggler=(7, 1.0))
    assert span(ring) == pytest.approx(14 * xfer(S / 8), abs=1e-9)


@pytest.mark.parametrize("delay_ms", [1.0, 25.0])
def test_stragglar_of_eight_on_circuits_pays_one_switch_per_segment(delay_ms: float) -> None:
    """K = 2 packs the nine rounds into five segments, each behind a switch."""
    calls, events = simulate("all_reduce", 8, S, "stragglar", mode="on-demand", k=2,
                             delay_ms=delay_ms, straggler=(7, 1.0))
    arrival = next(float(c["t_intent"]) for c in calls if c["rank"] == 7)
    assert max(float(c["t_end"]) for c in calls) - arrival == pytest.approx(
        9 * xfer(S / 7) + 5 * delay_ms / 1e3, abs=1e-9)
    assert {c["segments"] for c in calls if c["rank"] == 7} == {5}
    # rank 0 takes part in every segment and in the reduce-scatter before them
    assert {c["segments"] for c in calls if c["rank"] == 0} == {6}
    assert decisions(events) >= 2 * 6  # both iterations switch for each of their segments
