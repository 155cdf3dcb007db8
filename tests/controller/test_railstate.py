"""The rail-state semantics (the public Opus artifact's bitmask model), worked by hand.

One rail, two pipeline stages: ranks 0, 1 are stage 0 (FSDP replicas), ranks 2, 3 stage 1.
Groups: A = fsdp {0, 1} (clears bit 0), B = fsdp {2, 3} (clears bit 1), X = p2p 0-2 and
Y = p2p 1-3 (set bits {0, 1}). The data rail is packet-switched; bits 0 and 1 switch on shadow
rails 1 and 2. Delay 100 ms, no control latency; the driver's lights are played back on a
virtual clock by :class:`_Clocked`.
"""

from __future__ import annotations

import pytest
from clocked_core import ClockedCore

from controller.core import Ack, CoreConfig, Intent, OpusCore
from controller.job import CommGroup, JobError, JobSpec, rail_job_ports
from controller.ocs import RailDescription, Reconfiguration
from controller.railstate import (
    NO_OP,
    REFLIP,
    BitOp,
    RailStateModel,
    bit_op_of,
    flip_reconf,
    shadow_rails,
)

DELAY_S = 0.1
STAGES = {0: 0, 1: 0, 2: 1, 3: 1}
GROUPS = (CommGroup("A", "fsdp", (0, 1)), CommGroup("B", "fsdp", (2, 3)),
          CommGroup("X", "pp", (0, 2), "pairs"), CommGroup("Y", "pp", (1, 3), "pairs"))
MEMBERS = {g.group_id: g.ranks for g in GROUPS}


def _job(groups: tuple[CommGroup, ...] = GROUPS) -> JobSpec:
    return JobSpec("j", rail_job_ports(range(4), 1, 1), {g.group_id: g for g in groups},
                   STAGES)


def _rails(data_mode: str = "electrical") -> list[RailDescription]:
    data = RailDescription(0, (1, 2, 3, 4), 0.0, data_mode)
    return [data] + [RailDescription(s, (1, 2, 3), DELAY_S * 1e3, "ocs")
                     for s in shadow_rails(1, 2)]


class _Clocked(ClockedCore):
    """A core on a virtual clock: decisions light after the delay, acks are recorded."""

    def __init__(self, provisioning: bool = False, inflight: str = "join") -> None:
        mode = "provisioning" if provisioning else "on-demand"
        super().__init__(OpusCore(_rails(), CoreConfig.for_mode(
            mode, semantics="rail-state", rail_state_inflight=inflight)), DELAY_S)
        self.acks: dict[tuple[str, int], list[tuple[float, bool]]] = {}
        self.seq: dict[tuple[int, str], int] = {}
        out = self.core.register_job(_job(), 0.0)
        assert not out.rejects and not out.decisions

    def record_ack(self, ack: Ack) -> None:
        self.acks.setdefault((ack.group_id, ack.seq), []).append((self.now, ack.reconfigured))

    def ask(self, t_s: float, group: str) -> int:
        """Every member of ``group`` asks for its next call at ``t_s``; returns the seq."""
        self.run_until(t_s)
        seq = self.seq.get((0, group), 0)
        for rank in MEMBERS[group]:
            self.seq[(rank, group)] = seq + 1
            self.take(self.core.intent(Intent("j", rank, group, seq), self.now, ref=rank))
        return seq

    def ack_time(self, group: str, seq: int) -> float:
        times = {t for t, _ in self.acks[(group, seq)]}
        assert len(self.acks[(group, seq)]) == len(MEMBERS[group]) and len(times) == 1
        return times.pop()

    def masks(self) -> tuple[int, int]:
        rs = self.core._model.job  # (RailStateSwitching)
        assert rs is not None
        return rs.model.requested[0], rs.model.completed[0]


def test_railstate_worked_example() -> None:
    """The five requests of the design note under ``reflip`` (the artifact's controller): acks
    at 0, 110, 210, 310, 410 ms."""
    c = _Clocked(inflight="reflip")
    a0 = c.ask(0.000, "A")  # clears bit 0: already clear, acked at once
    x = c.ask(0.010, "X")  # sets {0, 1}: bits 0, 1 switch 10 -> 110 ms
    y = c.ask(0.020, "Y")  # requested 11 but completed still 00: re-flips both, 110 -> 210
    b = c.ask(0.120, "B")  # clears bit 1 (requested 01, completed 11): waits for Y, 210 -> 310
    a1 = c.ask(0.130, "A")  # requested 00 against completed 11: bit 0 is Y's until 210, bit 1
    #                         queued behind B until 310, so both switch 310 -> 410
    c.run_until()
    got = {name: c.ack_time(g, s) for name, g, s in
           (("A", "A", a0), ("X", "X", x), ("Y", "Y", y), ("B", "B", b), ("A'", "A", a1))}
    assert got == pytest.approx({"A": 0.0, "X": 0.110, "Y": 0.210, "B": 0.310, "A'": 0.410})
    assert c.acks[("A", a0)][0][1] is False and c.acks[("X", x)][0][1] is True
    assert c.masks() == (0b00, 0b00)
    counters = c.core.counters
    assert counters["acked_at_once"] == 1
    assert counters["stale_reflips"] == 3  # Y: bits 0, 1 (X takes them to 1); A': bit 1 (B)
    assert counters["decisions"] == 4 and counters["bit_flips"] == 7
    assert counters["rail_state_early_bits"] == 0
    served = [e for e in c.events if e["event"] == "rail_state_served"]
    assert [(e["group"], e["requested"]["0"], e["completed"]["0"]) for e in served] == [
        ("A", 0b00, 0b00), ("X", 0b11, 0b00), ("Y", 0b11, 0b00), ("B", 0b01, 0b11),
        ("A", 0b00, 0b11)]


def test_railstate_worked_example_joining() -> None:
    """The same requests under ``join`` (the default): Y joins X's switch (110 ms); B flips
    bit 1 120 -> 220; A' joins B on bit 1 and flips bit 0 130 -> 230."""
    c = _Clocked()
    a0 = c.ask(0.000, "A")
    x = c.ask(0.010, "X")
    y = c.ask(0.020, "Y")
    b = c.ask(0.120, "B")
    a1 = c.ask(0.130, "A")
    c.run_until()
    got = {name: c.ack_time(g, s) for name, g, s in
           (("A", "A", a0), ("X", "X", x), ("Y", "Y", y), ("B", "B", b), ("A'", "A", a1))}
    assert got == pytest.approx({"A": 0.0, "X": 0.110, "Y": 0.110, "B": 0.220, "A'": 0.230})
    assert c.masks() == (0b00, 0b00)
    counters = c.core.counters
    assert counters["stale_reflips"] == 0 and counters["rail_state_joined_bits"] == 3
    assert counters["decisions"] == 3 and counters["bit_flips"] == 4


def test_railstate_at_once_uses_completed() -> None:
    """A request equal to the completed mask is acked at once while a switch is in flight."""
    c = _Clocked()
    c.ask(0.0, "X")
    c.run_until(0.2)
    assert c.masks() == (0b11, 0b11)
    c.ask(0.30, "A")  # clears bit 0: 11 -> 10, switching 300 -> 400 ms
    y = c.ask(0.31, "Y")  # target 11 = completed: at once, while bit 0 switches
    assert c.ack_time("Y", y) == pytest.approx(0.31)
    c.run_until(0.5)
    assert c.masks() == (0b11, 0b10)  # the last switch to finish (A's) wrote completed
    x = c.ask(0.6, "X")  # so the next PP request switches bit 0 back
    c.run_until()
    assert c.ack_time("X", x) == pytest.approx(0.7)
    assert c.masks() == (0b11, 0b11)


@pytest.mark.parametrize("inflight, a_ack_s, reflips, joined",
                         [("reflip", 1.2, 1, 0), ("join", 1.101, 0, 1)])
def test_railstate_1f1b_stale_pattern(inflight: str, a_ack_s: float, reflips: int,
                                      joined: int) -> None:
    """From 11, stage 1 clears bit 1, then stage 0 clears bit 0: the second one's stale diff
    includes bit 1. ``reflip``: queued behind the first, it acks one delay later; ``join``:
    it waits for the first's switch of bit 1 while its bit 0 switches, one delay after it
    asked."""
    c = _Clocked(inflight=inflight)
    c.ask(0.0, "X")
    c.run_until(0.2)
    b = c.ask(1.0, "B")
    a = c.ask(1.001, "A")
    c.run_until()
    assert c.ack_time("B", b) == pytest.approx(1.1)
    assert c.ack_time("A", a) == pytest.approx(a_ack_s)
    assert c.core.counters["stale_reflips"] == reflips
    assert c.core.counters["rail_state_joined_bits"] == joined
    assert c.masks() == (0b00, 0b00)


def test_railstate_provisioned_call_is_acked_at_once() -> None:
    """Predictions of every member serve the call; the real asks after the light wait for
    nothing (reconfigured False) and only the last-asking member's prediction counts."""
    c = _Clocked(provisioning=True)
    for rank in (0, 2):
        c.take(c.core.predict(Intent("j", rank, "X", 0), 0.0))
    assert [e["group"] for e in c.events if e["event"] == "decision"][-1] == "X"
    c.run_until(0.15)
    for rank in (0, 2):
        c.take(c.core.intent(Intent("j", rank, "X", 0), c.now, ref=rank))
    assert c.acks[("X", 0)] == [(0.15, False), (0.15, False)]


def test_railstate_late_prediction_is_dropped() -> None:
    c = _Clocked(provisioning=True)
    c.ask(0.0, "A")
    c.take(c.core.predict(Intent("j", 0, "A", 0), 0.0))
    assert c.core.counters["late_predictions"] == 1


def test_railstate_switches_only_shadow_rails() -> None:
    """Every decision flips shadow rails (bit 0 on rail 1, bit 1 on rail 2), alternating the
    circuits 1-2 and 1-3; the data rail is never touched."""
    c = _Clocked()
    for t, g in ((0.0, "X"), (0.2, "A"), (0.4, "B"), (0.6, "Y")):
        c.ask(t, g)
    c.run_until()
    starts = [(e["rail"], e["add"], e["remove"]) for e in c.events
              if e["event"] == "reconfig_start"]
    assert starts == [(1, [[1, 2]], []), (2, [[1, 2]], []),  # X sets bits 0, 1
                      (1, [[1, 3]], [[1, 2]]),  # A clears bit 0
                      (2, [[1, 3]], [[1, 2]]),  # B clears bit 1
                      (1, [[1, 2]], [[1, 3]]), (2, [[1, 2]], [[1, 3]])]  # Y sets both again


def test_model_alone_orders_bits_first_come_first_served() -> None:
    m = RailStateModel([0], REFLIP)
    first = m.serve(1, {0: BitOp("set", frozenset({0, 1}))})
    assert first.request is not None and first.start == (1,)
    second = m.serve(2, {0: BitOp("clear", frozenset({1}))})  # 01 against 00: bit 0 flips
    assert second.request is not None and second.request.bits == {(0, 0)}
    assert second.start == () and second.stale_bits == 1  # request 1 takes bit 0 to 1 already
    third = m.serve(3, {0: BitOp("set", frozenset({0}))})  # 01 again: bit 0, behind request 2
    assert third.start == () and third.stale_bits == 1
    assert m.finished(1) == (2,) and m.settled() == [(1, True)]
    assert m.completed[0] == 0b11
    assert m.finished(2) == (3,) and m.settled() == [(2, True)]
    assert m.completed[0] == 0b01
    assert m.finished(3) == () and m.settled() == [(3, True)]
    assert m.requested[0] == m.completed[0] == 0b01


def test_model_alone_joins_a_switch_to_the_same_value() -> None:
    """``join``: request 2 wants bit 0 at 1, which request 1 is switching to: it flips
    nothing, starts nothing, and settles with request 1; a failed switch fails its joiners."""
    m = RailStateModel([0])
    assert m.serve(1, {0: BitOp("set", frozenset({0}))}).start == (1,)
    second = m.serve(2, {0: BitOp("set", frozenset({0}))})
    assert second.request is not None and second.request.bits == frozenset()
    assert second.request.after == {1} and second.joined_bits == 1 and second.start == ()
    assert m.settled() == []
    assert m.finished(1) == () and m.settled() == [(1, True), (2, True)]
    assert m.completed[0] == 0b01
    m.serve(3, {0: BitOp("clear", frozenset({0}))})
    m.serve(4, {0: BitOp("clear", frozenset({0}))})
    assert m.finished(3, lit=False) == () and m.settled() == [(3, False), (4, False)]
    assert m.completed[0] == 0b01


def test_model_counts_bits_held_behind_a_waiting_request() -> None:
    """Bit 0 of rail 1 is free but held by request 2 (waiting for rail 0's bit): request 3 on
    it waits too, where the artifact's per-bit threads would have let it run."""
    m = RailStateModel([0, 1], REFLIP)
    set0, set1 = BitOp("set", frozenset({0})), BitOp("set", frozenset({1}))
    assert m.serve(1, {0: set0}).start == (1,)
    second = m.serve(2, {0: set1, 1: set0})  # rail 0: 11 against 00, bit 0 busy: waits
    assert second.start == () and second.early_bits == 0
    third = m.serve(3, {1: set0})  # rail 1 bit 0: free, but request 2 holds it
    assert third.start == () and third.early_bits == 1
    assert m.finished(1) == (2,)
    assert m.finished(2) == (3,)


def test_bit_ops_of_groups() -> None:
    assert bit_op_of(GROUPS[2], STAGES) == BitOp("set", frozenset({0, 1}))
    assert bit_op_of(GROUPS[1], STAGES) == BitOp("clear", frozenset({1}))
    assert bit_op_of(CommGroup("pp0", "pp", (0, 2)), STAGES) == NO_OP
    assert BitOp("clear", frozenset({1})).apply(0b11) == 0b01
    with pytest.raises(JobError, match="axis 'cp'"):
        bit_op_of(CommGroup("cp0", "cp", (0, 1)), STAGES)
    with pytest.raises(JobError, match="adjacent"):
        bit_op_of(CommGroup("p", "pp", (0, 2), "pairs"), {0: 0, 2: 2})
    with pytest.raises(JobError, match="span stages"):
        bit_op_of(CommGroup("f", "fsdp", (0, 2)), STAGES)


def test_shadow_flips_alternate_two_circuits() -> None:
    first = flip_reconf(5, ())
    assert first == Reconfiguration.of(5, add=[(1, 2)])
    second = flip_reconf(5, first.add)
    assert second == Reconfiguration.of(5, add=[(1, 3)], remove=[(1, 2)])
    assert flip_reconf(5, second.add) == Reconfiguration.of(5, add=[(1, 2)], remove=[(1, 3)])
    assert shadow_rails(2, 2) == {2: (0, 0), 3: (0, 1), 4: (1, 0), 5: (1, 1)}


def test_rail_state_refuses_what_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="degree-aware"):
        CoreConfig.for_mode("degree-aware", semantics="rail-state")
    with pytest.raises(ValueError, match="semantics must be one of"):
        CoreConfig(semantics="exact")
    core = OpusCore(_rails()[:2], CoreConfig(semantics="rail-state"))  # bit 1's rail missing
    out = core.register_job(_job(), 0.0)
    assert out.rejects and "shadow rail 2" in out.rejects[0].message
    core = OpusCore(_rails("ocs"), CoreConfig(semantics="rail-state"))
    assert "packet-switched" in core.register_job(_job(), 0.0).rejects[0].message
    core = OpusCore(_rails(), CoreConfig(semantics="rail-state"))
    assert not core.register_job(_job(), 0.0).rejects
    other = JobSpec("k", {}, {}, {})
    assert "one job per controller" in core.register_job(other, 0.0).rejects[0].message
    no_stages = JobSpec("j", rail_job_ports(range(4), 1, 1), {g.group_id: g for g in GROUPS})
    core = OpusCore(_rails(), CoreConfig(semantics="rail-state"))
    assert "pipeline stage" in core.register_job(no_stages, 0.0).rejects[0].message


def test_job_stages_round_trip_json() -> None:
    job = _job()
    assert JobSpec.from_json(job.to_json()).stages == STAGES
    with pytest.raises(JobError, match="stages must name every rank"):
        JobSpec("j", job.ranks, job.groups, {0: 0})


def test_call_ready_follows_a_prediction_to_its_light() -> None:
    """(the sim's provisioning barrier waits on this) a predicted call is ready once every
    member named it and its bits lit; one the core holds nothing for is ready at once."""
    c = _Clocked(provisioning=True)
    assert c.core.call_ready("j", "X", 0, 0)  # nothing held for it
    c.take(c.core.predict(Intent("j", 0, "X", 0), 0.0))
    assert not c.core.call_ready("j", "X", 0, 0)  # gathering: rank 2 has not named it yet
    c.take(c.core.predict(Intent("j", 2, "X", 0), 0.0))
    assert not c.core.call_ready("j", "X", 0, 2)  # bits 0 and 1 switching
    c.run_until(DELAY_S / 2)
    assert not c.core.call_ready("j", "X", 0, 0)
    c.run_until(DELAY_S)
    assert c.core.call_ready("j", "X", 0, 0) and c.core.call_ready("j", "X", 0, 2)
    c.take(c.core.predict(Intent("j", 1, "Y", 0), DELAY_S))  # bits already set: served at once
    c.take(c.core.predict(Intent("j", 3, "Y", 0), DELAY_S))
    assert c.core.call_ready("j", "Y", 0, 1)
