"""Faults on calient-tl1, twin by twin with tests/polatis/test_faults.py: each gives a clear
error, and the view is re-read from the switch before anything else is sent."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from controller.drivers.polatis.driver import PolatisDriver
from controller.drivers.polatis.errors import (
    DeviceAuthError,
    DeviceMismatch,
    DeviceRejected,
    DeviceSessionLost,
    DeviceTimeout,
    DeviceUnreachable,
)
from controller.drivers.polatis.tl1 import Tl1Framer, parse_reply
from controller.drivers.registry import make_driver
from controller.ocs import Circuit, PortState, Reconfiguration, ReconfigurationRejected
from emulator.calient.model import CalientDevice
from emulator.calient.tl1_server import CalientTl1Server

from .conftest import SIZE, ocs_config

Connect = Callable[..., PolatisDriver]


def test_wrong_credentials_are_refused_by_name(tl1: CalientTl1Server) -> None:
    with pytest.raises(DeviceAuthError, match="login as 'admin' refused") as err:
        make_driver(ocs_config(tl1.port), env={"OPUS_OCS_PASSWORD": "wrong"})
    assert f"calient-tl1 127.0.0.1:{tl1.port}" in str(err.value)


def test_an_unreachable_host_is_named() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DeviceUnreachable, match=f"calient-tl1 127.0.0.1:{port}"):
        make_driver(ocs_config(port, timeout_s=2), env={"OPUS_OCS_PASSWORD": "x"})


def test_a_switch_of_another_size_is_refused(tl1: CalientTl1Server, connect: Connect) -> None:
    with pytest.raises(DeviceMismatch, match=r"\(8x8\) but rail 0 is configured for 16x16"):
        connect(tl1.port, size=16)
    with pytest.raises(DeviceMismatch, match="do not fit"):
        connect(tl1.port, size=None, ports=[1, 2, 9])


def test_slow_replies_time_out_then_the_rail_is_re_read_first(
        device: CalientDevice, tl1: CalientTl1Server, connect: Connect) -> None:
    driver = connect(tl1.port, timeout_s=0.3)
    device.faults.reply_delay_s = 1.0
    with pytest.raises(DeviceTimeout, match="no reply"):
        driver.apply(0, add=[(1, 2)])
    assert driver.is_dirty(0)  # the re-read right after timed out as well
    device.faults.reply_delay_s = 0.0
    # Meanwhile somebody connected 3-4 by hand: the next request is checked against the
    # re-read switch, so it is refused before anything is sent.
    device.activate(device.enter(3, 4, two_way=True))
    edits = device.edits
    with pytest.raises(ReconfigurationRejected, match="port 3 already has peer 4"):
        driver.apply(0, add=[(3, 5)])
    assert device.edits == edits and not driver.is_dirty(0)
    # Whatever part of the timed-out batch landed (one command per step), the view is what
    # the switch says: a reserved 1-2 is a stray half, an active one a circuit.
    view = driver.read_device(0)
    assert Circuit(0, 3, 4) in view.circuits
    assert driver.known_circuits(0) == view.circuits


def test_session_dropped_after_the_edit_landed_is_re_read(
        device: CalientDevice, tl1: CalientTl1Server, connect: Connect) -> None:
    """Twin of the NETCONF drop: the batch landed, the reply never came."""
    driver = connect(tl1.port)
    driver.apply(0, add=[(1, 2)])
    device.faults.drop_after_edits = 6  # CANC, DLT, ENT, ENT, ACT, ACT: all landed
    with pytest.raises(DeviceSessionLost) as err:
        driver.apply_many([Reconfiguration.of(0, add=[(1, 3), (2, 4)], remove=[(1, 2)])])
    assert "re-read from the device" in " ".join(err.value.__notes__)
    assert driver.known_circuits(0) == {Circuit(0, 1, 3), Circuit(0, 2, 4)}
    assert not driver.is_dirty(0)
    driver.apply(0, remove=[(1, 3)])
    assert sorted(device.connections()) == ["1.1.2-1.1.4"]


def test_session_dropped_mid_batch_leaves_a_reservation_that_is_cleared(
        device: CalientDevice, tl1: CalientTl1Server, connect: Connect) -> None:
    """Twin of the Polatis TL1 drop: a reserved connection is a stray half, dark, and goes in
    the next edit that sets its ports."""
    driver = connect(tl1.port)
    driver.apply(0, add=[(1, 2)])
    device.faults.drop_after_edits = 3  # CANC 1-2, DLT 1-2, ENT 1-3, then the line drops
    with pytest.raises(DeviceSessionLost):
        driver.apply_many([Reconfiguration.of(0, add=[(1, 3)], remove=[(1, 2)])])
    (conn,) = device.connections().values()
    assert (conn.src, conn.dst, conn.active) == (1, 3, False)
    view = driver.read_device(0)
    assert view.circuits == frozenset() and view.stray_pairs == {(1, SIZE + 3)}
    assert driver.known_circuits(0) == frozenset()
    states = driver.port_states(0)
    assert states[1] == states[3] == PortState.DARK and states[2] == PortState.IDLE
    driver.apply(0, add=[(1, 3)])  # deletes the reservation in the same batch
    assert device.pairs() == {1: SIZE + 3, 3: SIZE + 1}
    assert driver.read_device(0).stray_pairs == frozenset()


def test_device_refusal_names_rail_ports_and_reason_then_re_reads(
        device: CalientDevice, tl1: CalientTl1Server, connect: Connect) -> None:
    driver = connect(tl1.port)
    driver.apply(0, add=[(1, 2)])
    device.activate(device.enter(3, 4, two_way=False))  # 3>4 by hand, behind the driver
    with pytest.raises(DeviceRejected) as err:
        driver.apply(0, add=[(4, 5)])  # needs 4's output, which 3>4 holds
    exc = err.value
    assert exc.rail == 0 and exc.code == "SAAS"
    assert {4, 5} <= set(exc.ports)
    assert "Invalid Connection: port 1.1.4 is in use by 1.1.3>1.1.4" in str(exc)
    assert driver.read_device(0).stray_pairs == {(3, SIZE + 4)}  # the re-read saw it
    driver.apply(0, add=[(4, 5)])  # now clears the one-way connection on the way
    assert sorted(device.connections()) == ["1.1.1-1.1.2", "1.1.4-1.1.5"]


def test_a_refused_edit_leaves_no_reservation_and_the_next_try_lands(
        device: CalientDevice, tl1: CalientTl1Server, connect: Connect) -> None:
    driver = connect(tl1.port)
    edits = device.edits
    device.faults.refuse_edits = 1  # the first ENT-CRS of the batch is denied
    with pytest.raises(DeviceRejected, match=r"port\(s\) 1, 2: ENT-CRS denied") as err:
        driver.apply(0, add=[(1, 2), (3, 4)])
    assert err.value.code == "SROF" and device.edits == edits
    assert device.connections() == {} and driver.known_circuits(0) == frozenset()
    device.faults.refuse_edits = 0
    # a refusal of the second ENT-CRS: the first reservation is deleted again
    device.enter(4, 6, two_way=False)  # makes ENT-CRS 3-4 fail (4's input is used)
    with pytest.raises(DeviceRejected):
        driver.apply(0, add=[(1, 2), (3, 4)])
    assert sorted(device.connections()) == ["1.1.4>1.1.6"]
    driver.apply(0, add=[(1, 2), (3, 4)])  # the re-read saw 4>6: deleted in this batch
    assert driver.circuits(0) == {Circuit(0, 1, 2), Circuit(0, 3, 4)}
    assert sorted(device.connections()) == ["1.1.1-1.1.2", "1.1.3-1.1.4"]


def test_a_failed_port_reads_failed(device: CalientDevice, tl1: CalientTl1Server,
                                    connect: Connect) -> None:
    driver = connect(tl1.port)
    driver.apply(0, add=[(1, 2), (3, 4)])
    device.faults.failed_ports.update({2, 5})  # a lit port and an idle one
    states = driver.port_states(0)
    assert states[2] == states[5] == PortState.FAILED
    assert states[1] == PortState.DARK  # its peer is failed: no light arrives
    assert states[3] == states[4] == PortState.LIT and states[6] == PortState.IDLE
    status = driver.inner._link(0).session.port_status()
    assert status[2] == status[SIZE + 2] == "FAILED" and status[1] == "ENABLED"
    with pytest.raises(DeviceRejected, match=r"Failed: port 1\.1\.5 is failed"):
        driver.apply(0, add=[(5, 6)])


def test_rtrv_port_reply_on_the_wire(device: CalientDevice, tl1: CalientTl1Server) -> None:
    device.faults.failed_ports.add(3)
    with socket.create_connection(("127.0.0.1", tl1.port), timeout=5) as s:
        s.sendall(b"RTRV-PORT::ALL:0;ACT-USER::admin:1::root;RTRV-PORT::1.1.2&1.1.3:2;"
                  b"RTRV-PORT-SUM::1.1.3:3;RTRV-PORT::9.9.9:4;")
        framer, messages = Tl1Framer(), []
        while len(messages) < 5:
            messages += framer.feed(s.recv(4096).decode())
    replies = [parse_reply(m) for m in messages]
    assert replies[0] is not None and replies[0].code == "PLNA"
    assert replies[2] is not None and replies[2].data == (
        "1.1.2:WX,NONE,NONE:INAS=OOS-NP,INOS=OOS,INOC=OK,INRS=NPR,OUTAS=OOS-NP,OUTOS=OOS,"
        "OUTOC=OK,OUTRS=NPR",
        "1.1.3:WX,NONE,NONE:INAS=OOS-NP,INOS=OOS,INOC=FAIL,INRS=NPR,OUTAS=OOS-NP,OUTOS=OOS,"
        "OUTOC=FAIL,OUTRS=NPR")
    assert replies[3] is not None and replies[3].data == (
        "1.1.3:ALIAS=NONE,INPWR=NONE,OUTPWR=NONE,CONNNAME1=NONE,CONNSTATE1=NONE,"
        "CONNNAME2=NONE,CONNSTATE2=NONE",)
    assert replies[4] is not None and replies[4].code == "IIAC"
