"""The replayer follows :mod:`testbed.plan.progress` on real threads: lanes, dependencies and
iteration boundaries and the phase barrier, shown by the times in its records (loopback, no
controller: the calls are rail-state calls that do not ask, or a stand-in shim, with no
steps)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.shim import CollectiveGrant
from testbed.emulated.replayer import Replayer
from testbed.plan.rankplan import RankPlan
from testbed.plan.replay import COMPUTE_LANE, PlanOp


def _plan(tmp_path: Path, iterations: int) -> dict[str, object]:
    ops = [PlanOp(0, COMPUTE_LANE, (), duration_s=0.02),
           PlanOp(1, "dp", (0,), kind="allgather", axis="dp", gated=False, tag="ag"),
           PlanOp(2, "pp", (), kind="send", axis="pp", gated=False, tag="send"),
           PlanOp(3, COMPUTE_LANE, (1, 2), duration_s=0.01)]
    return {"rank": 0, "job": "j", "endpoint": "tcp://127.0.0.1:9", "addr": "127.0.0.1",
            "peers": {"0": "127.0.0.1"}, "port": 0, "iterations": iterations,
            "ack_timeout_s": 10.0, "io_timeout_s": 10.0,
            "records": str(tmp_path / "rank0.jsonl"), "ops": [op.to_json() for op in ops]}


def test_ops_start_after_their_deps_and_iterations_after_the_previous(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 3)
    replayer = Replayer(RankPlan.from_json(plan))
    assert replayer.run() == 0
    replayer.out.close()
    records = [json.loads(line) for line in Path(str(plan["records"])).read_text().splitlines()]
    by = {(r["ev"], r.get("it"), r.get("i")): r for r in records}
    assert [r["ev"] for r in records][-1] == "finished"
    for it in range(3):
        c0, ag, c3 = by[("compute", it, 0)], by[("call", it, 1)], by[("compute", it, 3)]
        send = by[("call", it, 2)]
        assert c0["t_end"] <= ag["t_intent"]  # dep 0 -> 1
        assert max(ag["t_end"], send["t_end"]) <= c3["t_start"]  # deps 1, 2 -> 3
        iteration = by[("iteration", it, None)]
        assert iteration["t_start"] <= send["t_intent"] and c3["t_end"] <= iteration["t_end"]
        if it:  # nothing of an iteration starts before the previous one ended
            assert by[("iteration", it - 1, None)]["t_end"] <= send["t_intent"]
        # the call's number is its position in the lane across iterations
        assert ag["seq"] == it and send["seq"] == it
        assert c3["t_end"] - c3["t_start"] >= 0.01


class _SlowShim:
    """Acks at once; a call of group ``pp`` lasts 0.2 s."""

    job_id = "j"

    @contextlib.contextmanager
    def collective(self, group: str, kind: str, size_bytes: int, axis: str,
                   gated: bool = True) -> Iterator[CollectiveGrant]:
        yield CollectiveGrant(group, 0, False, 0.0)
        if group == "pp":
            time.sleep(0.2)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("barrier", [False, True])
def test_the_phase_barrier_holds_the_next_phase_until_the_last_call_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, barrier: bool) -> None:
    """On demand (the artifact's MODE=baseline): the pipeline call ends its phase (the next
    main-thread call asks and is of the other family), so it closes the barrier at its ack
    and the data-parallel call, ready 30 ms later on another lane, waits for its end."""
    ops = [PlanOp(0, COMPUTE_LANE, (), duration_s=0.03),
           PlanOp(1, "pp", (), kind="send", axis="pp", gated=False, tag="send"),
           PlanOp(2, "dp", (0,), kind="all_gather", axis="fsdp", gated=True, tag="ag")]
    plan = {**_plan(tmp_path, 1), "ops": [op.to_json() for op in ops]}
    if barrier:
        plan["phase_barrier"] = True
    monkeypatch.setattr(Replayer, "_shim", lambda self, ep, lane: _SlowShim())
    replayer = Replayer(RankPlan.from_json(plan))
    assert replayer.run() == 0
    replayer.out.close()
    records = [json.loads(line) for line in Path(str(plan["records"])).read_text().splitlines()]
    calls = {r["tag"]: r for r in records if r["ev"] == "call"}
    held = calls["ag"]["t_intent"] >= calls["send"]["t_end"]
    assert held is barrier


class _ProvisioningShim(_SlowShim):
    """:class:`_SlowShim` whose waited predictions are answered 0.2 s later (a switch)."""

    def __init__(self) -> None:
        self.answered: list[float] = []

    def predict(self, group: str, seq: int, kind: str = "", size_bytes: int = 0,
                axis: str = "", wait: bool = False) -> None:
        if wait:
            time.sleep(0.2)
            self.answered.append(time.time())


def test_with_provisioning_the_barrier_also_waits_for_the_predictions_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With provisioning (the artifact's MODE=provision): the pipeline call closes the barrier
    as it starts, and after its end the rank waits for the answer to its prediction of the
    next phase's first call (the data-parallel call) before that call may start."""
    ops = [PlanOp(0, COMPUTE_LANE, (), duration_s=0.03),
           PlanOp(1, "pp", (), kind="send", axis="pp", gated=False, tag="send", predict=2),
           PlanOp(2, "dp", (0,), kind="all_gather", axis="fsdp", gated=True, tag="ag")]
    plan = {**_plan(tmp_path, 2), "ops": [op.to_json() for op in ops], "phase_barrier": True,
            "phase_barrier_provisioning": True}
    shim = _ProvisioningShim()
    monkeypatch.setattr(Replayer, "_shim", lambda self, ep, lane: shim)
    replayer = Replayer(RankPlan.from_json(plan))
    assert replayer.run() == 0
    replayer.out.close()
    records = [json.loads(line) for line in Path(str(plan["records"])).read_text().splitlines()]
    calls = {(r["it"], r["tag"]): r for r in records if r["ev"] == "call"}
    assert len(shim.answered) == 2  # one per iteration
    for it in range(2):
        assert calls[(it, "ag")]["t_intent"] >= shim.answered[it] >= calls[(it, "send")]["t_end"]
    assert [r["barrier_holds"] for r in records if r["ev"] == "finished"] == [2]
