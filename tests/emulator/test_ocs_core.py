"""emulator.ocs_core: the OpenFlow operations of set-up and reconfiguration, run on a fake table.

As FAUCET tests its ``Valve``: the core's operations are applied to a small in-test flow table
with OpenFlow 1.3 semantics, and the tests ask that table where a packet entering a port goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.ocs import Circuit, RailDescription, Reconfiguration, ReconfigurationRejected
from emulator.ocs_core import (
    Barrier,
    BarrierKind,
    DeleteAllFlows,
    FlowAdd,
    FlowDelete,
    OcsRails,
    Operation,
    TableMiss,
    WaitDelay,
    setup_operations,
    switch_operations,
)

OCS_RAIL = RailDescription(0, tuple(range(1, 9)), 5.0, "ocs")
ELECTRICAL_RAIL = RailDescription(1, (1, 2, 3, 4), 0.0, "electrical")
SECOND_OCS_RAIL = RailDescription(2, (1, 2, 3, 4), 25.0, "ocs")

DROP = "drop"
NORMAL = "normal"


class FakeFlowTable:
    """One switch's table as OpenFlow 1.3 leaves it after the core's operations.

    Circuit flows match ``in_port`` at the circuit priority: an add replaces the flow with the
    same match and priority, a strict delete removes exactly it. The table-miss flow sits below.
    """

    def __init__(self) -> None:
        self.circuit_flows: dict[int, int] = {}
        self.table_miss: TableMiss | None = None

    def apply(self, op: Operation) -> None:
        if isinstance(op, DeleteAllFlows):
            self.circuit_flows.clear()
            self.table_miss = None
        elif isinstance(op, TableMiss):
            self.table_miss = op
        elif isinstance(op, FlowAdd):
            self.circuit_flows[op.in_port] = op.out_port
        elif isinstance(op, FlowDelete):
            self.circuit_flows.pop(op.in_port, None)
        # Barrier and WaitDelay leave the table as it is.

    def apply_all(self, ops: Iterable[Operation]) -> None:
        for op in ops:
            self.apply(op)

    def forward(self, in_port: int) -> int | str:
        """Where a packet entering ``in_port`` goes: an output port, DROP or NORMAL."""
        if in_port in self.circuit_flows:
            return self.circuit_flows[in_port]
        if self.table_miss is not None and self.table_miss.normal:
            return NORMAL
        return DROP  # OpenFlow 1.3: no table-miss flow drops too

    def circuits(self, rail: int) -> frozenset[Circuit]:
        """Port pairs that forward to each other both ways."""
        return frozenset(Circuit(rail, a, b) for a, b in self.circuit_flows.items()
                         if a < b and self.circuit_flows.get(b) == a)


def connected(rails: Sequence[RailDescription], circuits: Iterable[Circuit] = ()
              ) -> tuple[OcsRails, dict[int, FakeFlowTable]]:
    """A core whose rails hold ``circuits``, and each rail's table after set-up."""
    core = OcsRails(rails)
    by_rail: dict[int, list[Circuit]] = {}
    for c in circuits:
        by_rail.setdefault(c.rail, []).append(c)
    core.accept([Reconfiguration.of(rail, add=cs) for rail, cs in sorted(by_rail.items())])
    tables = {}
    for r in rails:
        tables[r.rail] = FakeFlowTable()
        tables[r.rail].apply_all(core.setup(r.rail))
    return core, tables


def ports_named(ops: Iterable[Operation]) -> set[int]:
    """Every port an operation names (as match or output)."""
    out: set[int] = set()
    for op in ops:
        if isinstance(op, FlowAdd):
            out |= {op.in_port, op.out_port}
        elif isinstance(op, FlowDelete):
            out.add(op.in_port)
    return out


# --- set-up ----------------------------------------------------------------------------------


def test_setup_of_an_ocs_rail_drops_on_miss_and_installs_its_circuits() -> None:
    core, tables = connected([OCS_RAIL], [Circuit(0, 1, 2), Circuit(0, 5, 3)])
    ops = core.setup(0)
    assert ops[0] == DeleteAllFlows()
    assert ops[1] == TableMiss(normal=False)
    assert ops[-1] == Barrier(BarrierKind.SETUP)
    table = tables[0]
    assert table.circuits(0) == {Circuit(0, 1, 2), Circuit(0, 3, 5)}
    assert {p: table.forward(p) for p in (4, 6, 7, 8)} == dict.fromkeys((4, 6, 7, 8), DROP)


def test_setup_of_an_electrical_rail_forwards_every_port_normally() -> None:
    core, tables = connected([ELECTRICAL_RAIL])
    assert core.setup(1) == (DeleteAllFlows(), TableMiss(normal=True), Barrier(BarrierKind.SETUP))
    assert {tables[1].forward(p) for p in ELECTRICAL_RAIL.ports} == {NORMAL}


def test_setup_wipes_flows_left_by_an_earlier_controller() -> None:
    core = OcsRails([OCS_RAIL])
    table = FakeFlowTable()
    table.apply_all([TableMiss(normal=True), FlowAdd(7, 8), FlowAdd(8, 7)])
    table.apply_all(core.setup(0))
    assert table.circuits(0) == frozenset()
    assert {table.forward(p) for p in OCS_RAIL.ports} == {DROP}


def test_setup_rejects_an_unknown_mode_by_name() -> None:
    with pytest.raises(ValueError, match="'packet'"):
        setup_operations("packet", [])
    with pytest.raises(ValueError, match=r"rail 3: .*'packet'"):
        OcsRails([RailDescription(3, (1, 2), 0.0, "packet")])


# --- reconfiguration -------------------------------------------------------------------------


def test_reconfiguration_lights_added_circuits_both_ways_and_darkens_removed_ones() -> None:
    core, tables = connected([OCS_RAIL], [Circuit(0, 1, 2), Circuit(0, 3, 4)])
    [ops] = core.accept([Reconfiguration.of(0, add=[(1, 3), (5, 6)], remove=[(1, 2), (3, 4)])])
    table = tables[0]
    table.apply_all(ops)
    assert (table.forward(1), table.forward(3)) == (3, 1)
    assert (table.forward(5), table.forward(6)) == (6, 5)
    assert (table.forward(2), table.forward(4)) == (DROP, DROP)
    assert table.circuits(0) == core.circuits(0) == {Circuit(0, 1, 3), Circuit(0, 5, 6)}


def test_untouched_circuits_keep_their_flows_and_appear_in_no_operation() -> None:
    untouched = [Circuit(0, 5, 6), Circuit(0, 7, 8)]
    core, tables = connected([OCS_RAIL], [Circuit(0, 1, 2), *untouched])
    table = tables[0]
    before = {p: table.forward(p) for c in untouched for p in c.ports}
    [ops] = core.accept([Reconfiguration.of(0, add=[(1, 3), (2, 4)], remove=[(1, 2)])])
    assert ports_named(ops) == {1, 2, 3, 4}
    assert all(isinstance(op, FlowAdd | FlowDelete | Barrier | WaitDelay) for op in ops)
    for op in ops:
        table.apply(op)
        assert {p: table.forward(p) for p in before} == before


def test_no_touched_port_forwards_between_the_dark_and_the_light_barrier() -> None:
    core, tables = connected([OCS_RAIL], [Circuit(0, 1, 2), Circuit(0, 3, 4)])
    reconf = Reconfiguration.of(0, add=[(1, 4), (2, 3)], remove=[(1, 2), (3, 4)])
    [ops] = core.accept([reconf])
    dark = ops.index(Barrier(BarrierKind.DARK))
    light = ops.index(Barrier(BarrierKind.LIGHT))
    assert dark < ops.index(WaitDelay(OCS_RAIL.switching_delay_ms)) < light == len(ops) - 1
    assert not any(isinstance(op, FlowAdd) for op in ops[:dark])  # break before make
    assert not any(isinstance(op, FlowDelete) for op in ops[dark:])
    table = tables[0]
    table.apply_all(ops[:dark])
    for op in ops[dark:light]:
        table.apply(op)
        if op == Barrier(BarrierKind.DARK) or isinstance(op, WaitDelay):
            assert {table.forward(p) for p in reconf.touched_ports} == {DROP}
    table.apply(ops[light])
    assert table.circuits(0) == {Circuit(0, 1, 4), Circuit(0, 2, 3)}


def test_switching_waits_the_rail_delay_in_force_when_accepted() -> None:
    core, _ = connected([OCS_RAIL, SECOND_OCS_RAIL])
    first, second = core.accept([Reconfiguration.of(0, add=[(1, 2)]),
                                 Reconfiguration.of(2, add=[(1, 2)])])
    assert WaitDelay(5.0) in first
    assert WaitDelay(25.0) in second
    core.set_delay_ms(0, 100.0)
    [later] = core.accept([Reconfiguration.of(0, remove=[(1, 2)])])
    assert WaitDelay(100.0) in later


@pytest.mark.parametrize("bad_delay_ms", [-1.0, float("nan"), float("inf")])
def test_bad_switching_delay_is_refused_naming_the_rail_and_changes_nothing(
    bad_delay_ms: float,
) -> None:
    core = OcsRails([OCS_RAIL])
    with pytest.raises(ValueError, match="rail 0: switching delay"):
        core.set_delay_ms(0, bad_delay_ms)
    assert core.delay_ms[0] == OCS_RAIL.switching_delay_ms


def test_empty_reconfiguration_needs_no_operation() -> None:
    assert switch_operations(Reconfiguration(0), 5.0) == ()


def test_request_that_breaks_one_to_one_is_refused_before_any_operation() -> None:
    core, _ = connected([OCS_RAIL, SECOND_OCS_RAIL], [Circuit(0, 1, 2)])
    valid = Reconfiguration.of(2, add=[(1, 2)])
    second_peer = Reconfiguration.of(0, add=[(1, 3)])  # port 1 already has peer 2
    with pytest.raises(ReconfigurationRejected) as info:  # raised instead of operations
        core.accept([valid, second_peer])
    assert (info.value.rail, info.value.ports) == (0, (1, 2))
    assert core.circuits(0) == {Circuit(0, 1, 2)}
    assert core.circuits(2) == frozenset()  # all-or-nothing: the valid request is not applied


def test_electrical_rail_refuses_circuits() -> None:
    core, _ = connected([ELECTRICAL_RAIL])
    with pytest.raises(ReconfigurationRejected, match="electrical"):
        core.accept([Reconfiguration.of(1, add=[(1, 2)])])


def test_unknown_rail_is_refused_by_name() -> None:
    core, _ = connected([OCS_RAIL])
    with pytest.raises(ReconfigurationRejected, match=r"rail 9.*no such rail"):
        core.accept([Reconfiguration.of(9, add=[(1, 2)])])


@st.composite
def valid_reconfiguration(draw: st.DrawFn, circuits: frozenset[Circuit]) -> Reconfiguration:
    """A request valid on a rail holding ``circuits``: remove some, then pair free ports."""
    remove = draw(st.sets(st.sampled_from(sorted(circuits)))) if circuits else set()
    kept = circuits - remove
    free = [p for p in OCS_RAIL.ports if not any(p in c.ports for c in kept)]
    order = draw(st.permutations(free))
    pairs = draw(st.integers(0, len(order) // 2))
    add = [(order[2 * i], order[2 * i + 1]) for i in range(pairs)]
    return Reconfiguration.of(0, add=add, remove=remove)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_fake_table_always_equals_the_state_after_valid_reconfigurations(
    data: st.DataObject,
) -> None:
    core, tables = connected([OCS_RAIL])
    table = tables[0]
    for _ in range(data.draw(st.integers(1, 8), label="steps")):
        before = core.circuits(0)
        reconf = data.draw(valid_reconfiguration(before), label="reconfiguration")
        [ops] = core.accept([reconf])
        untouched = before - reconf.remove
        assert not ports_named(ops) & {p for c in untouched for p in c.ports}
        table.apply_all(ops)
        assert table.circuits(0) == core.circuits(0)
        lit = {p for c in core.circuits(0) for p in c.ports}
        assert {table.forward(p) for p in set(OCS_RAIL.ports) - lit} <= {DROP}


def test_the_delay_starts_at_the_dark_barriers_reply_so_the_wait_follows_it_at_once() -> None:
    """The shell times the wait from the reply to the barrier right before it (the removal
    known applied: docs/wire.md, "The dark edge"), so nothing may sit between them."""
    core, _ = connected([OCS_RAIL], [Circuit(0, 1, 2)])
    [ops] = core.accept([Reconfiguration.of(0, add=[(1, 3)], remove=[(1, 2)])])
    dark = ops.index(Barrier(BarrierKind.DARK))
    wait = ops[dark + 1]
    assert isinstance(wait, WaitDelay)
    t_applied_s = 7.25
    assert wait.until_s(t_applied_s) == pytest.approx(t_applied_s + OCS_RAIL.switching_delay_ms
                                                      / 1e3)
