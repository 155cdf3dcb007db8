"""The artifact shim's phase barrier with provisioning (``ocs.rail_state_phase_barrier``,
``MODE=provision`` without ``USE_CUDA_STREAM``): closed when a phase's last call starts, open
once that call ended and the next phase's switch it predicted is done."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.experiment.config import load_experiment
from testbed.experiment.prepare import prepare
from testbed.plan.phasebarrier import PhaseBarrier
from testbed.plan.replay import PlanOp
from testbed.simulator.run import build_simulation

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _op(index: int, axis: str) -> PlanOp:
    return PlanOp(index=index, lane=f"{axis}0", deps=(),
                  kind="send" if axis == "pp" else "all_gather", axis=axis, gated=True)


def test_barrier_opens_only_when_the_call_ended_and_its_prediction_was_answered() -> None:
    ops = [_op(0, "dp"), _op(1, "dp"), _op(2, "pp")]  # phases: dp dp | pp (cyclic)
    barrier = PhaseBarrier({0: ops}, provisioning=True)
    assert barrier.ends[0] == frozenset({1, 2})
    first, last = object(), object()
    barrier.started(0, 0, first)  # not a phase end: nothing closes
    barrier.acked(0, 1, last)  # (on demand's closing point: ignored with provisioning)
    assert not barrier.hold(0, ("a",))
    barrier.started(0, 1, last)
    assert barrier.closed_by(0, last) and barrier.hold(0, ("b",)) and barrier.hold(0, ("c",))
    assert list(barrier.answered(0, first)) == []  # not the holder
    assert list(barrier.ended(0, last)) == []  # ended, the switch not done yet
    assert barrier.hold(0, ("d",))
    barrier.waiting[0] = ("pp0", 0, last)
    assert barrier.poll("j", lambda *_: False) == [] and 0 in barrier.waiting
    assert barrier.poll("j", lambda job, g, s, r: (job, g, s, r) == ("j", "pp0", 0, 0)) == [
        (0, last)]
    assert not barrier.waiting
    assert list(barrier.answered(0, last)) == [("b",), ("c",), ("d",)]
    assert not barrier.closed_by(0, last) and not barrier.hold(0, ("e",))
    assert barrier.holds == 3


def test_on_demand_barrier_is_unchanged() -> None:
    ops = [_op(0, "dp"), _op(1, "pp")]
    barrier = PhaseBarrier({0: ops})
    call = object()
    barrier.started(0, 0, call)  # (provisioning's closing point: ignored on demand)
    assert not barrier.hold(0, ("a",))
    barrier.acked(0, 0, call)
    assert barrier.hold(0, ("b",))
    assert list(barrier.answered(0, call)) == []  # (provisioning only)
    assert list(barrier.ended(0, call)) == [("b",)]


def _run(barrier: bool) -> tuple[Any, list[dict[str, Any]]]:
    cfg = load_experiment(EXAMPLES / "tiny.yaml").replace(
        semantics="rail-state", mode="provisioning", switching_delay=50.0,
        rail_state_phase_barrier=barrier)
    sim = build_simulation(prepare(cfg, check_capacity=False))
    records, _events = sim.run()
    return sim, records


def test_provisioning_holds_every_call_from_a_phase_end_to_the_next_switch() -> None:
    """On the tiny job: no call of a rank starts while its phase's last call runs, the next
    phase's first call starts only after that call ended and its prediction was answered, every rank
    finishes, and the held switches make the step longer than without the barrier."""
    sim, records = _run(True)
    n = len(sim.ranks)
    assert sum(1 for r in records if r["ev"] == "finished") == n
    barrier = sim._barrier
    assert barrier is not None and barrier.provisioning and barrier.holds > 0
    assert not barrier.holder and not barrier.waiting
    calls = [r for r in records if r["ev"] == "call"]
    for rank, ends in barrier.ends.items():
        mine = sorted((r for r in calls if r["rank"] == rank), key=lambda r: r["t_intent"])
        for end in (r for r in mine if r["i"] in ends):
            assert not [r for r in mine if end["t_intent"] < r["t_intent"] < end["t_end"]]
            later = [r for r in mine if r["t_intent"] >= end["t_end"]]
            if later:  # the next call waited for the end and the answer (control messages)
                assert later[0]["t_intent"] > end["t_end"]
    _free, plain = _run(False)
    assert sum(1 for r in plain if r["ev"] == "finished") == n

    def step(recs: list[dict[str, Any]]) -> float:
        return max(r["t_end"] for r in recs if r["ev"] == "iteration")

    assert step(records) > step(plain)
