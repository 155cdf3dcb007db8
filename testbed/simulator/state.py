"""The objects of one simulated run (:mod:`testbed.simulator.engine`): a rank's state and
lanes, its calls in progress, their TCP connections and flows, the rail ports the flows share,
and the mirrors that let one simulated rank stand for others.

Plain classes with ``__slots__``, not dataclasses: millions are made per large run, and the
engine reads their fields on its hottest paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller.profile import CallProfile
from testbed.plan.progress import Lane, RankProgress
from testbed.plan.replay import PlanOp


class Port:
    """One direction of one rail port: the flows that share it."""

    __slots__ = ("flows",)

    def __init__(self) -> None:
        self.flows: list[Flow] = []


NO_PORT = Port()


class Conn:
    """One TCP connection of a call to a peer: its flows go out one after the other.

    ``src``/``dst``: the ports its flows take, found in routing epoch ``epoch`` (routes change
    only when a request is applied or the job is registered again:
    :attr:`~testbed.simulator.invariants.CircuitInvariants.routes_epoch`).
    """

    __slots__ = ("busy", "dst", "epoch", "queue", "src")

    def __init__(self) -> None:
        self.busy = False
        self.queue: list[Flow] = []
        self.epoch = -1
        self.src = self.dst = NO_PORT


class Flow:
    __slots__ = ("bits", "call", "conn", "dst", "k", "n", "peer", "rate", "src", "t_last",
                 "token")

    def __init__(self, call: Call, peer: int, k: int, n: int, conn: Conn) -> None:
        self.call = call
        self.peer = peer
        self.k = k
        self.n = n
        self.bits = n * 8.0
        self.conn = conn
        self.src = self.dst = NO_PORT
        self.rate = 0.0
        self.t_last = 0.0
        self.token = 0


class Call:
    __slots__ = ("ack_timeouts", "conns", "end_k", "finishing", "first_seq", "group", "it", "k",
                 "lane", "last", "op", "rank", "received", "reconfigured", "seg", "seg_intent",
                 "segments", "sent", "seq", "sync_open", "t_ack", "t_intent", "undelivered",
                 "wait_s", "waiting")

    def __init__(self, rank: RankState, lane: Lane, op: PlanOp, it: int, t_intent: float) -> None:
        self.rank = rank
        self.lane = lane
        self.op = op
        self.it = it
        self.segments = op.call_segments
        self.seg = -1  # the segment in progress (one Opus call each)
        self.group = op.lane  # its comm group
        self.seq = self.first_seq = 0  # its sequence number; the first segment's
        self.seg_intent = self.t_intent = t_intent
        self.t_ack = 0.0
        self.wait_s = 0.0  # intent to ack, summed over the segments
        self.last = 0.0  # when the current step's sends were issued / receptions arrived
        self.k = self.end_k = 0
        self.sent = 0
        self.received = 0
        self.reconfigured = False
        self.ack_timeouts = 0  # segments that went on without their ack (rail-state timeout)
        self.undelivered = 0
        self.waiting = 0
        self.sync_open = 0  # sends of the current (sync) step not yet arrived
        self.finishing = False
        self.conns: dict[int, Conn] = {}


class RankState(RankProgress):
    """A simulated rank: its progress through the plan (:mod:`testbed.plan.progress`), its
    call profile and sequence numbers, and the arrivals its calls wait for."""

    __slots__ = ("by_tag", "expect", "inbox", "mirror_box", "mirror_wait", "profile", "rank",
                 "seq", "t_start")

    def __init__(self, rank: int, ops: list[PlanOp], iterations: int, first: int = 0) -> None:
        super().__init__(ops, iterations, first)
        self.rank = rank
        self.profile = CallProfile()
        self.seq: dict[str, int] = {}
        self.by_tag = {op.tag: op for op in ops if op.is_call}
        self.t_start = 0.0
        # (it, cid, sender, step): arrivals nobody waits for yet, and calls waiting
        self.inbox: dict[tuple[int, str, int, int], tuple[int, float]] = {}
        self.expect: dict[tuple[int, str, int, int], tuple[Call, int]] = {}
        # (it, tag, step): arrivals of this rank's transfers to mirrored ranks, and waiters
        self.mirror_box: dict[tuple[int, str, int], tuple[int, float]] = {}
        self.mirror_wait: dict[tuple[int, str, int], list[tuple[Call, int, int]]] = {}


@dataclass(frozen=True)
class Mirror:
    """Rank ``rank`` behaves as its representative; ``lanes`` maps the rep's lanes to its own."""

    rank: int
    lanes: Mapping[str, str]
