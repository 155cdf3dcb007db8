"""The rank records every backend writes: a call, a compute block, an iteration, and a call
that went on without its ack (typed).

One definition of their fields, used by the three writers: the emulated replayer
(:mod:`testbed.emulated.replayer`, JSON lines), the simulator (:mod:`testbed.simulator.engine`,
the same dicts in memory) and the torch job's lanes (:mod:`testbed.torchjob.lanes`, which adds
the fields of a real ``torch.distributed`` call). A record *is* its JSON form: a
:class:`~typing.TypedDict`, so that the simulator's hot path builds a plain dict (no object to
convert) while mypy checks every field name and type at each writer and reader. Times are
seconds: wall-clock (``time.time()``) in the emulator, the virtual clock's in the simulator.
``rank`` comes last in the JSON form, as the records were written before this module.

Under ``ocs.rail_state_ack_timeout_s`` a call whose ack came too late went on without it: both
backends then write an ``ack_timeout`` record when it went on and a ``late_ack`` record when the
ack came (:func:`ack_event_record`), and the call's record counts its segments that went on
(``ack_timeouts``, absent when none did). The rule itself (go on that long after the intent, drop
the late ack, complete the controller's call once both the call ended and the ack came) is
written in :mod:`controller.shim` (the emulator) and :mod:`testbed.simulator.engine`.

The builders take the plan op (:class:`~testbed.plan.replay.PlanOp`) for the fields a call's
plan fixes (lane, kind, axis, collective id, tag, byte counts), so no writer spells them.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from testbed.plan.replay import PlanOp

__all__ = ["AckEventRecord", "CallRecord", "ComputeRecord", "IterationRecord", "TorchCallRecord",
           "ack_event_record", "call_record", "compute_record", "iteration_record",
           "torch_call_record"]


class _CallFields(TypedDict):
    """A call's fields that are known when it is issued."""

    ev: Literal["call"]
    rank: int
    it: int
    i: int  # the op's plan index (torch: the call's number on the rank)
    lane: str  # the comm group
    kind: str
    axis: str
    cid: str  # the collective id every member shares
    tag: str
    seq: int  # the Opus call number in the group (the first segment's)
    reconfigured: bool  # the controller switched circuits for it
    sent: int  # bytes this rank sent (scaled)
    received: int
    expected: int  # bytes it had to receive
    size_bytes: int  # the call's real message bytes (what the shim reports)
    wire_bytes: int  # the real bytes this rank sends


class CallRecord(_CallFields):
    """A finished call: asked at ``t_intent``, acknowledged at ``t_ack``, ended at ``t_end``."""

    t_intent: float
    t_ack: float
    t_end: float
    retries: NotRequired[int]  # asked again after a failed switch (protocol.may_retry)
    ack_timeouts: NotRequired[int]  # segments that went on without their ack (rail-state)
    segments: NotRequired[int]  # a call with segments: how many, and their waits summed
    segment_wait_s: NotRequired[float]
    verified: NotRequired[bool]  # verify plans: every block the rank owns ended right
    wrong_blocks: NotRequired[list[int]]
    owned_bytes: NotRequired[int]
    epoch: NotRequired[int]  # runs with failover


class TorchCallRecord(_CallFields):
    """A torch job's call: the times are None until it reaches them (a failed call keeps
    them); the fields of the real ``torch.distributed`` call follow."""

    t_intent: float | None
    t_ack: float | None
    t_end: float | None
    op: str
    members: list[int]
    peer: int
    dtype: str
    torch_group: str
    scale_up: bool
    t_issue: float
    t_wait_start: float | None
    t_wait_end: float | None


class ComputeRecord(TypedDict):
    ev: Literal["compute"]
    rank: int
    it: int
    i: int
    t_start: float
    t_end: float
    epoch: NotRequired[int]


class IterationRecord(TypedDict):
    ev: Literal["iteration"]
    rank: int
    it: int
    t_start: float
    t_end: float
    epoch: NotRequired[int]


class AckEventRecord(TypedDict):
    """Call ``seq`` of ``group`` (op ``i`` of iteration ``it``) went on without its ack at
    ``t`` (``ack_timeout``), or its ack came late at ``t`` (``late_ack``)."""

    ev: Literal["ack_timeout", "late_ack"]
    it: int
    i: int
    group: str
    seq: int
    t: float
    rank: int


def ack_event_record(ev: Literal["ack_timeout", "late_ack"], rank: int, it: int, i: int,
                     group: str, seq: int, t: float) -> AckEventRecord:
    return {"ev": ev, "it": it, "i": i, "group": group, "seq": seq, "t": t, "rank": rank}


def call_record(op: PlanOp, rank: int, it: int, seq: int, reconfigured: bool, t_intent: float,
                t_ack: float, t_end: float, sent: int, received: int) -> CallRecord:
    """The record of call ``op`` of iteration ``it`` (positional: the simulator makes one per
    call)."""
    return {"ev": "call", "it": it, "i": op.index, "lane": op.lane, "kind": op.kind,
            "axis": op.axis, "cid": op.collective_id, "tag": op.tag, "seq": seq,
            "reconfigured": reconfigured, "t_intent": t_intent, "t_ack": t_ack, "t_end": t_end,
            "sent": sent, "received": received, "expected": op.expected_bytes,
            "size_bytes": op.size_bytes, "wire_bytes": op.wire_bytes, "rank": rank}


def torch_call_record(rank: int, it: int, i: int, lane: str, kind: str, axis: str, *,
                      expected: int, size_bytes: int, wire_bytes: int, op: str,
                      members: list[int], peer: int, dtype: str, torch_group: str,
                      scale_up: bool, t_issue: float) -> TorchCallRecord:
    """A torch call's record as it is issued: the lane fills in its number (``seq``, ``cid``,
    ``tag``), times and byte counts as the call runs."""
    return {"ev": "call", "rank": rank, "it": it, "i": i, "lane": lane, "kind": kind,
            "axis": axis, "cid": "", "tag": "", "seq": -1, "reconfigured": False,
            "t_intent": None, "t_ack": None, "t_end": None, "sent": 0, "received": 0,
            "expected": expected, "size_bytes": size_bytes, "wire_bytes": wire_bytes, "op": op,
            "members": members, "peer": peer, "dtype": dtype, "torch_group": torch_group,
            "scale_up": scale_up, "t_issue": t_issue, "t_wait_start": None, "t_wait_end": None}


def compute_record(rank: int, it: int, i: int, t_start: float, t_end: float) -> ComputeRecord:
    return {"ev": "compute", "it": it, "i": i, "t_start": t_start, "t_end": t_end, "rank": rank}


def iteration_record(rank: int, it: int, t_start: float, t_end: float) -> IterationRecord:
    return {"ev": "iteration", "it": it, "t_start": t_start, "t_end": t_end, "rank": rank}
