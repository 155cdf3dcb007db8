"""A rank's progress (:mod:`testbed.plan.progress`): the rules both backends follow."""

from __future__ import annotations

from testbed.plan.progress import RankProgress
from testbed.plan.replay import COMPUTE_LANE, PlanOp


def _ops() -> list[PlanOp]:
    return [PlanOp(0, COMPUTE_LANE, ()), PlanOp(1, "dp", (0,), tag="ag"),
            PlanOp(2, "pp", (), tag="send", predict=1), PlanOp(3, COMPUTE_LANE, (1, 2))]


def test_a_lane_waits_for_its_deps_and_is_handed_back() -> None:
    p = RankProgress(_ops(), iterations=2)
    compute, dp, pp = (p.lanes_by_name[n] for n in (COMPUTE_LANE, "dp", "pp"))
    assert p.next_op(dp) is None  # before the iteration started: parked until it does
    assert p.start_iteration() == p.lanes
    assert p.next_op(dp) is None  # op 1 waits for op 0
    op0 = p.next_op(compute)
    assert op0 is not None and op0.index == 0
    assert p.op_done(compute, op0) == [dp]
    op1 = p.next_op(dp)
    assert op1 is not None and op1.index == 1
    assert p.next_op(compute) is None  # op 3 waits for 1 and 2
    op2 = p.next_op(pp)
    assert op2 is not None and op2.index == 2
    assert p.op_done(pp, op2) is None
    assert p.op_done(dp, op1) == [compute]
    assert p.next_op(pp) is None and p.next_op(dp) is None  # iteration 1 has not started
    op3 = p.next_op(compute)
    assert op3 is not None and not p.iteration_done(0)
    p.op_done(compute, op3)
    assert p.iteration_done(0)
    assert set(map(id, p.start_iteration())) == {id(pp), id(dp)}


def test_a_lane_past_the_last_iteration_is_finished() -> None:
    p = RankProgress([PlanOp(0, COMPUTE_LANE, ())], iterations=1)
    lane = p.lanes[0]
    p.start_iteration()
    op = p.next_op(lane)
    assert op is not None
    p.op_done(lane, op)
    assert p.next_op(lane) is None and p.lane_finished(lane)


def test_a_prediction_numbers_calls_from_the_first_iteration() -> None:
    ops = _ops()
    # op 2 predicts op 1, which is before it in the plan: the next iteration's (one dp call
    # per iteration, so its number is that iteration's)
    assert RankProgress(ops, iterations=4).predicted(ops[2], 1)[1:] == (2, True)
    assert RankProgress(ops, iterations=4).predicted(ops[2], 3)[1:] == (4, False)  # past the end
    resumed = RankProgress(ops, iterations=4, first=2)  # a failover resumed at iteration 2
    assert resumed.predicted(ops[2], 2)[1:] == (1, True)  # numbered anew, from iteration 2
    assert resumed.predicted(ops[2], 3)[1:] == (2, False)
