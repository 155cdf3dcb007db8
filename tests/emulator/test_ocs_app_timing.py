"""The OCS app never lights early: the switching delay counts from the dark barrier's reply
(the removal known applied), not from the removal's sending (docs/wire.md, "The dark edge").

A fake clock, a fake switch that confirms the removal ``LAG_S`` after it is sent, and no real
Open vSwitch: the shell's timing alone is under test.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from os_ken.ofproto import ofproto_v1_3, ofproto_v1_3_parser

from controller.ocs import Circuit, RailDescription, Reconfiguration
from emulator import ocs_app
from emulator.ocs_app import OcsFabric
from emulator.ocs_core import WaitDelay

DELAY_MS = 5.0
LAG_S = 0.004  # the switch applies and confirms the removal this long after it is sent
RAIL = RailDescription(0, (1, 2, 3, 4), DELAY_MS)
OFPT_FLOW_MOD = 14
OFPT_BARRIER_REQUEST = 20


class FakeClock:
    """Advances only when the code under test sleeps, spins (a tick per read) or the fake
    switch answers."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        self.now_s += 1e-6
        return self.now_s


def _messages(data: bytes) -> list[tuple[int, int]]:
    """(type, xid) of each OpenFlow message in one write."""
    out, i = [], 0
    while i < len(data):
        _version, kind, length, xid = struct.unpack_from("!BBHI", data, i)
        out.append((kind, xid))
        i += length
    return out


class FakeDatapath:
    """os-ken's side of a bridge: records each write with its time; answers each barrier
    ``LAG_S`` later through the fabric, as os-ken's receive thread would."""

    id = 1
    ofproto = ofproto_v1_3
    ofproto_parser = ofproto_v1_3_parser

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.fabric: OcsFabric | None = None
        self.writes: list[tuple[float, list[tuple[int, int]]]] = []

    def send(self, data: bytes) -> None:
        messages = _messages(data)
        self.writes.append((self.clock.now_s, messages))
        barriers = [xid for kind, xid in messages if kind == OFPT_BARRIER_REQUEST]
        if barriers:
            self.clock.now_s += LAG_S
            assert self.fabric is not None
            for xid in barriers:
                self.fabric.on_barrier_reply(xid)


class FakeChannel:
    """A rail's own channel: records each write; each wait is answered ``LAG_S`` later."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.writes: list[tuple[float, list[tuple[int, int]]]] = []
        self.replies_s: list[float] = []

    def send(self, data: bytes) -> None:
        self.writes.append((self.clock.now_s, _messages(data)))

    def wait(self, xids: list[int], timeout_s: float | None = None) -> dict[int, dict[int, int]]:
        self.clock.now_s += LAG_S
        self.replies_s.append(self.clock.now_s)
        return {}


class NoFlush:
    def flush(self) -> None:
        pass

    def flush_ports(self, ports: list[str]) -> int:
        return 1


@pytest.fixture
def fabric(monkeypatch: pytest.MonkeyPatch) -> tuple[OcsFabric, FakeClock]:
    clock = FakeClock()
    monkeypatch.setattr(ocs_app.time, "sleep",
                        lambda s: setattr(clock, "now_s", clock.now_s + max(0.0, s)))
    monkeypatch.delenv(ocs_app.LIE_ENV, raising=False)
    fab = OcsFabric([RAIL], {0: 1}, clock=clock)
    fab._flushers = {None: NoFlush()}  # type: ignore[dict-item]
    yield fab, clock
    fab.close()


def _operations(fab: OcsFabric) -> tuple[Any, ...]:
    fab.core.state.apply(Reconfiguration.of(0, add=[(1, 2), (3, 4)]))
    [ops] = fab.core.accept([Reconfiguration.of(0, add=[(1, 4), (2, 3)],
                                                remove=[(1, 2), (3, 4)])])
    assert WaitDelay(DELAY_MS) in ops
    return ops


def _first_addition_s(writes: list[tuple[float, list[tuple[int, int]]]]) -> float:
    """When the write carrying the additions went out (the removals went in the first)."""
    later = [t for t, msgs in writes[1:] if any(k == OFPT_FLOW_MOD for k, _x in msgs)]
    assert later, writes
    return later[0]


def test_the_light_waits_the_delay_after_the_removal_is_confirmed_on_the_rails_channel(
        fabric: tuple[OcsFabric, FakeClock]) -> None:
    fab, clock = fabric
    ops = _operations(fab)
    channel = FakeChannel(clock)
    edges: dict[str, float] = {}
    fab._switch_on_channel(0, channel, FakeDatapath(clock), ops,  # type: ignore[arg-type]
                           frozenset({1, 2, 3, 4}), edges)
    t_sent = channel.writes[0][0]
    t_reply = channel.replies_s[0]
    assert edges["t_applied_s"] >= t_reply
    t_light = _first_addition_s(channel.writes)
    # timed from the send, the additions would go out at t_sent + delay: LAG_S too soon
    assert t_light >= edges["t_applied_s"] + DELAY_MS / 1e3
    assert t_light >= t_sent + LAG_S + DELAY_MS / 1e3
    assert t_light - (edges["t_applied_s"] + DELAY_MS / 1e3) < 1e-4  # and no later than that
    assert edges["t_applied_s"] <= edges["t_purged_s"] <= t_light


def test_the_light_waits_the_delay_after_the_removal_is_confirmed_over_osken(
        fabric: tuple[OcsFabric, FakeClock]) -> None:
    fab, clock = fabric
    ops = _operations(fab)
    datapath = FakeDatapath(clock)
    datapath.fabric = fab
    edges: dict[str, float] = {}
    pending = fab._run(datapath, ops, edges)
    fab._confirm(datapath, pending)
    t_sent = datapath.writes[0][0]
    t_light = _first_addition_s(datapath.writes)
    assert edges["t_applied_s"] >= t_sent + LAG_S
    assert t_light >= edges["t_applied_s"] + DELAY_MS / 1e3
    assert t_light - (edges["t_applied_s"] + DELAY_MS / 1e3) < 1e-4


def test_the_record_keeps_the_send_as_the_dark_start_and_the_reply_as_applied(
        fabric: tuple[OcsFabric, FakeClock], monkeypatch: pytest.MonkeyPatch) -> None:
    fab, clock = fabric
    fab.core.state.apply(Reconfiguration.of(0, add=[(1, 2)]))
    logged: list[dict[str, Any]] = []
    monkeypatch.setattr(fab, "_log", logged.append)
    channel = FakeChannel(clock)
    fab._datapaths[0] = FakeDatapath(clock)
    monkeypatch.setattr(fab, "_channel", lambda rail: channel)
    [ops] = fab.core.accept([Reconfiguration.of(0, add=[(1, 3)], remove=[(1, 2)])])
    job = ocs_app._Job(Reconfiguration.of(0, add=[(1, 3)], remove=[(1, 2)]), ops, clock(),
                       ocs_app.Future())
    result = fab._switch(0, job)
    [dark] = [r for r in logged if r["event"] == "dark"]
    assert dark["t_s"] == result.t_dark_s <= channel.writes[0][0]
    assert dark["t_s"] < dark["t_applied_s"] <= dark["t_purged_s"] < result.t_light_s
    # the recorded dark period: at least the delay, plus the lag of the confirmation
    assert result.t_light_s - result.t_dark_s >= DELAY_MS / 1e3 + LAG_S
    assert Circuit(0, 1, 3) in fab.core.circuits(0)
