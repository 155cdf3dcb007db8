"""Verify plans: each rank's steps carry the blocks that, moved as the replayer moves them
(:class:`testbed.plan.verify.CallData`), leave every rank with exactly its data."""

from __future__ import annotations

import pytest

from testbed.plan.replay import PlanOp, build_plan
from testbed.plan.verify import CallData
from workloads.config import Straggler
from workloads.hardware import Cluster
from workloads.micro import collectives_schedule

ALGORITHMS = {
    "ring+pairwise": (),
    "stragglar+matchings": (("all_reduce", "", "stragglar"), ("all_to_all", "", "matchings")),
    "multihop": (("all_to_all", "ep", "multihop"),),
}


def exchange(calls: dict[int, PlanOp], iteration: int = 0) -> dict[int, CallData]:
    """Run one collective's per-rank steps in lockstep: every send of a step, then every
    reception; each payload must have the size the plan says."""
    data = {r: CallData(op.blocks, op.collective_id, iteration, r) for r, op in calls.items()}
    n_steps = {len(op.steps) for op in calls.values()}
    assert len(n_steps) == 1
    for k in range(n_steps.pop()):
        wire = {}
        for r, op in calls.items():
            step = op.steps[k]
            for (peer, n), carried in zip(step.sends, step.send_blocks, strict=True):
                payload = data[r].outgoing(carried)
                assert len(payload) == n
                wire[(r, peer)] = payload
        for r, op in calls.items():
            step = op.steps[k]
            for (peer, n), carried in zip(step.recvs, step.recv_blocks, strict=True):
                assert len(wire[(peer, r)]) == n
                data[r].incoming(carried, wire.pop((peer, r)))
        assert not wire, "a send nobody receives"
    return data


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
@pytest.mark.parametrize(("n", "electrical"), [(4, False), (8, True), (5, True)])
def test_every_rank_ends_with_its_blocks(name: str, n: int, electrical: bool) -> None:
    algorithms = ALGORITHMS[name]
    stragglers = (Straggler(n - 2, 0.01),) if "stragglar" in name and n in (4, 8) else ()
    if "stragglar" in name and not stragglers:
        algorithms = algorithms[1:]  # StragglAR needs a power-of-two group
    sched = collectives_schedule(Cluster(n, 1), [("all_to_all", n * 3001), ("all_reduce", 7777),
                                                 ("all_gather", 999), ("reduce_scatter", 4096)],
                                 algorithms=algorithms, stragglers=stragglers)
    plan = build_plan(sched, scale=0.5, ports_per_rank=2, electrical=electrical, verify=True)
    by_cid: dict[str, dict[int, PlanOp]] = {}
    for r, ops in plan.programs.items():
        for op in ops:
            if op.is_call:
                assert op.blocks, "verify plans carry their blocks"
                by_cid.setdefault(op.collective_id, {})[r] = op
    assert len(by_cid) == 4
    for cid, calls in by_cid.items():
        data = exchange(calls)
        for r, d in data.items():
            assert d.wrong_blocks() == [], (cid, r)
            assert d.owned_bytes() > 0
        if cid.endswith("all_to_all0"):  # a rank owns the blocks the others sent it
            for r, op in calls.items():
                assert data[r].owned_bytes() == sum(
                    n_ for b, n_, c, o in op.blocks if r in o and r not in c)


def test_a_wrong_byte_is_caught() -> None:
    sched = collectives_schedule(Cluster(4, 1), [("all_reduce", 300)])
    plan = build_plan(sched, scale=1.0, ports_per_rank=2, verify=True)
    calls = {r: ops[-1] for r, ops in plan.programs.items()}
    data = exchange(calls)
    data[2].held[1][0] ^= 1
    assert data[2].wrong_blocks() == [1] and data[1].wrong_blocks() == []
