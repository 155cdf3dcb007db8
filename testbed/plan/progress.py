"""A rank's progress through its replay plan: the rules both backends follow (pure).

One implementation of what the emulated replayer (:mod:`testbed.emulated.replayer`: threads that
block) and the simulator (:mod:`testbed.simulator.engine`: callbacks on a virtual clock) used
to write each on its own:

* **lanes**: a rank's ops run in lanes (the compute lane and one per comm group), each in plan
  order;
* **dependencies**: an op starts only once every op it depends on (same iteration) is done;
* **iteration boundaries**: no op of iteration ``i + 1`` starts before the rank started it,
  which it does once every op of iteration ``i`` is done (the shell says when: it may first
  fire faults or mark the call profile);
* **predictions** (rail-state provisioning): which call, with which sequence number, a rank
  names to the controller after a call with ``predict``;
* **retries**: :func:`controller.protocol.may_retry` (one rule for every shim).

:class:`RankProgress` holds no clock and starts nothing: :meth:`RankProgress.next_op` says which
op a lane may start now (or parks the lane where it waits), :meth:`RankProgress.op_done` says
which parked lanes may go on. The shells keep what is theirs: the replayer its threads (a
parked lane's thread sleeps until a lane it was handed back wakes it), sockets and shim; the
engine its event heap and network model. The hot loop of the simulator calls these methods
for every op, so they stay small and allocate nothing on the common path.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from testbed.plan.replay import PlanOp
from testbed.plan.requestpoints import lane_positions, predicted_call

__all__ = ["Lane", "RankProgress"]


R = TypeVar("R", bound="RankProgress")


class Lane(Generic[R]):
    """One lane of a rank: its ops in plan order, the next one (``pos``) and its iteration."""

    __slots__ = ("it", "name", "ops", "pos", "rank")

    def __init__(self, rank: R, name: str, ops: list[PlanOp]) -> None:
        self.rank = rank  # the progress (a shell's subclass of it) the lane belongs to
        self.name = name
        self.ops = ops
        self.pos = 0
        self.it = 0


class RankProgress:
    """Which op of a rank's plan each lane may run, from iteration ``first`` (a rank that
    resumes after a failover starts there) to ``iterations - 1``.

    Not thread-safe: a threaded shell calls it under one lock.
    """

    __slots__ = ("done", "first", "iterations", "lanes", "lanes_by_name", "left", "ops",
                 "positions", "started", "wait_go", "waiters")

    def __init__(self, ops: list[PlanOp], iterations: int, first: int = 0) -> None:
        self.ops = ops
        self.iterations = iterations
        self.positions: dict[int, tuple[int, int]] | None = None  # for predictions, lazily
        by_lane: dict[str, list[PlanOp]] = {}
        for op in ops:
            by_lane.setdefault(op.lane, []).append(op)
        self.lanes: list[Lane[Any]] = [Lane(self, name, lops) for name, lops in by_lane.items()]
        self.first = first
        for lane in self.lanes:
            lane.it = first
        self.lanes_by_name = {ln.name: ln for ln in self.lanes}
        self.done = [bytearray(len(ops)) for _ in range(iterations)]
        self.left = [len(ops)] * iterations  # ops of each iteration not done yet
        self.waiters: dict[tuple[int, int], list[Lane[Any]]] = {}  # (it, op index) -> lanes parked
        self.wait_go: list[Lane[Any]] = []  # lanes parked until the next iteration starts
        self.started = first - 1  # the last iteration started

    def start_iteration(self) -> list[Lane[Any]]:
        """Start the next iteration; returns the lanes that may go on (all, for the first)."""
        self.started += 1
        lanes = self.lanes if self.started == self.first else self.wait_go
        self.wait_go = []
        return lanes

    def next_op(self, lane: Lane[Any]) -> PlanOp | None:
        """The op ``lane`` may start now; None if it has none left or must wait, in which
        case it is parked and handed back by :meth:`op_done` or :meth:`start_iteration`."""
        if lane.pos == len(lane.ops):
            lane.it += 1
            lane.pos = 0
            if lane.it >= self.iterations:
                return None
        it = lane.it
        if it > self.started:
            self.wait_go.append(lane)
            return None
        op = lane.ops[lane.pos]
        done = self.done[it]
        for d in op.deps:
            if not done[d]:
                self.waiters.setdefault((it, d), []).append(lane)
                return None
        return op

    def op_done(self, lane: Lane[Any], op: PlanOp) -> list[Lane[Any]] | None:
        """``op``, the op ``lane`` ran, is done: returns the lanes parked on it (the caller
        then asks :meth:`next_op` for them, then for ``lane``); :meth:`iteration_done` says
        whether it ended the iteration."""
        it = lane.it
        self.done[it][op.index] = 1
        self.left[it] -= 1
        lane.pos += 1
        return self.waiters.pop((it, op.index), None)

    def iteration_done(self, it: int) -> bool:
        return not self.left[it]

    def lane_finished(self, lane: Lane[Any]) -> bool:
        """Whether :meth:`next_op` found the lane past its last iteration (ask no more)."""
        return lane.it >= self.iterations

    def predicted(self, op: PlanOp, it: int) -> tuple[PlanOp, int, bool]:
        """After call ``op`` of iteration ``it`` (``op.predict`` >= 0): the call the rank names
        to the controller, its sequence number and whether it is in the run (a call past the
        last iteration is named to no one). Sequence numbers count from iteration ``first``: a
        resumed rank's calls are numbered anew, under a new job."""
        if self.positions is None:
            self.positions = lane_positions(self.ops)
        seq, target_it = predicted_call(self.positions, op.index, op.predict, it - self.first)
        return self.ops[op.predict], seq, target_it + self.first < self.iterations
