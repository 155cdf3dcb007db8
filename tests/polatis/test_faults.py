"""Faults: each gives a clear error, and the view is re-read from the device before any send."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from controller.drivers.polatis import tl1 as tl1_wire
from controller.drivers.polatis.driver import PolatisDriver
from controller.drivers.polatis.errors import (
    DeviceAuthError,
    DeviceMismatch,
    DeviceRejected,
    DeviceSessionLost,
    DeviceTimeout,
    DeviceUnreachable,
)
from controller.drivers.polatis.ports import PortMap
from controller.drivers.registry import make_driver
from controller.ocs import Circuit, PortState, Reconfiguration, ReconfigurationRejected
from emulator.polatis import NetconfServer, PolatisDevice, Tl1Server

from .conftest import SIZE, ocs_config

Connect = Callable[..., PolatisDriver]
PROTOCOLS = ["netconf", "tl1"]


def _server(protocol: str, netconf: NetconfServer, tl1: Tl1Server) -> int:
    return netconf.port if protocol == "netconf" else tl1.port


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_credentials_are_refused_by_name(protocol: str, netconf: NetconfServer,
                                                tl1: Tl1Server) -> None:
    port = _server(protocol, netconf, tl1)
    with pytest.raises(DeviceAuthError, match="login as 'admin' refused") as err:
        make_driver(ocs_config(protocol, port), env={"OPUS_OCS_PASSWORD": "wrong"})
    assert f"127.0.0.1:{port}" in str(err.value)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_unreachable_host_is_named(protocol: str) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DeviceUnreachable, match=f"127.0.0.1:{port}"):
        make_driver(ocs_config(protocol, port, timeout_s=2), env={"OPUS_OCS_PASSWORD": "x"})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_switch_of_another_size_is_refused(protocol: str, netconf: NetconfServer,
                                              tl1: Tl1Server, connect: Connect) -> None:
    port = _server(protocol, netconf, tl1)
    with pytest.raises(DeviceMismatch, match=r"\(8x8\) but rail 0 is configured for 16x16"):
        connect(protocol, port, size=16)
    with pytest.raises(DeviceMismatch, match="do not fit"):
        connect(protocol, port, size=None, ports=[1, 2, 9])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_slow_replies_time_out_then_the_rail_is_re_read_first(
        protocol: str, device: PolatisDevice, netconf: NetconfServer, tl1: Tl1Server,
        connect: Connect) -> None:
    driver = connect(protocol, _server(protocol, netconf, tl1), timeout_s=0.3)
    device.faults.reply_delay_s = 1.0
    with pytest.raises(DeviceTimeout, match="no reply"):
        driver.apply(0, add=[(1, 2)])
    assert driver.is_dirty(0)  # the re-read right after timed out as well
    device.faults.reply_delay_s = 0.0
    # Meanwhile somebody patched port 3 by hand: the next request is checked against the
    # re-read device, so it is refused before anything is sent.
    device.load({**device.pairs(), 3: SIZE + 4, 4: SIZE + 3})
    edits = device.edits
    with pytest.raises(ReconfigurationRejected, match="port 3 already has peer 4"):
        driver.apply(0, add=[(3, 5)])
    assert device.edits == edits and not driver.is_dirty(0)
    # Whatever part of the timed-out batch landed (TL1 is one command per pair), the view is
    # what the glass says.
    on_glass = PortMap(0, SIZE, tuple(range(1, SIZE + 1))).decode(device.pairs())
    assert Circuit(0, 3, 4) in on_glass.circuits
    assert driver.known_circuits(0) == on_glass.circuits


def test_netconf_session_dropped_mid_batch(device: PolatisDevice, netconf: NetconfServer,
                                           connect: Connect) -> None:
    driver = connect("netconf", netconf.port)
    driver.apply(0, add=[(1, 2)])
    device.faults.drop_after_edits = 1  # applied, but the reply never comes
    with pytest.raises(DeviceSessionLost) as err:
        driver.apply_many([Reconfiguration.of(0, add=[(1, 3), (2, 4)],
                                              remove=[(1, 2)])])
    assert "re-read from the device" in " ".join(err.value.__notes__)
    # The edit did land: the view was re-read over a new session and agrees with the glass.
    assert driver.known_circuits(0) == {Circuit(0, 1, 3), Circuit(0, 2, 4)}
    assert not driver.is_dirty(0)
    assert netconf.sessions_opened == 2
    driver.apply(0, remove=[(1, 3)])
    assert device.pairs() == {2: SIZE + 4, 4: SIZE + 2}


def test_tl1_session_dropped_mid_batch_leaves_a_one_way_pair_that_is_cleared(
        device: PolatisDevice, tl1: Tl1Server, connect: Connect) -> None:
    driver = connect("tl1", tl1.port)
    driver.apply(0, add=[(1, 2)])
    device.faults.drop_after_edits = 3  # DLT 1, DLT 2, ENT 1->N+3, then the line drops
    with pytest.raises(DeviceSessionLost):
        driver.apply_many([Reconfiguration.of(0, add=[(1, 3)], remove=[(1, 2)])])
    assert device.pairs() == {1: SIZE + 3}
    view = driver.read_device(0)
    assert view.circuits == frozenset() and view.stray_pairs == {(1, SIZE + 3)}
    assert driver.known_circuits(0) == frozenset()
    states = driver.port_states(0)
    assert states[1] == states[3] == PortState.DARK and states[2] == PortState.IDLE
    driver.apply(0, add=[(1, 3)])  # deletes the stray half in the same batch
    assert device.pairs() == {1: SIZE + 3, 3: SIZE + 1}
    assert driver.read_device(0).stray_pairs == frozenset()


def test_device_refusal_names_rail_ports_and_reason_then_re_reads(
        device: PolatisDevice, netconf: NetconfServer, connect: Connect) -> None:
    driver = connect("netconf", netconf.port)
    driver.apply(0, add=[(1, 2)])
    device.load({**device.pairs(), 3: SIZE + 4})  # by hand, behind the driver's back
    with pytest.raises(DeviceRejected) as err:
        driver.apply(0, add=[(4, 5)])  # needs egress N+4, which ingress 3 holds
    exc = err.value
    assert exc.rail == 0 and exc.code == "in-use"
    assert {3, 4, 5} <= set(exc.ports)
    assert f"egress port {SIZE + 4} is already in use by ingress 3" in str(exc)
    assert driver.read_device(0).stray_pairs == {(3, SIZE + 4)}  # the re-read saw it
    driver.apply(0, add=[(4, 5)])  # now clears the stray pair on the way
    assert device.pairs() == {1: SIZE + 2, 2: SIZE + 1, 4: SIZE + 5, 5: SIZE + 4}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_failed_port_reads_failed_on_both_protocols(protocol: str, device: PolatisDevice,
                                                      netconf: NetconfServer, tl1: Tl1Server,
                                                      connect: Connect) -> None:
    driver = connect(protocol, _server(protocol, netconf, tl1))
    driver.apply(0, add=[(1, 2), (3, 4)])
    device.faults.failed_ports.add(SIZE + 2)  # the receive side of rail port 2 (lit before)
    device.faults.failed_ports.add(5)  # an idle port's ingress
    states = driver.port_states(0)
    assert states[2] == states[5] == PortState.FAILED
    assert states[1] == states[3] == states[4] == PortState.LIT
    assert states[6] == PortState.IDLE
    assert driver.inner._link(0).session.port_status()[SIZE + 2] == "FAILED"


def test_tl1_shutter_reply_on_the_wire(device: PolatisDevice, tl1: Tl1Server) -> None:
    device.faults.failed_ports.add(3)
    with socket.create_connection(("127.0.0.1", tl1.port), timeout=5) as s:
        s.sendall(b"ACT-USER::admin:1::root;RTRV-PORT-SHUTTER::2&&4:2:;RTRV-PORT-SHUTTER::99:3:;")
        framer, messages = tl1_wire.Tl1Framer(), []
        while len(messages) < 3:
            messages += framer.feed(s.recv(4096).decode())
    replies = [tl1_wire.parse_reply(m) for m in messages]
    assert replies[1] is not None and replies[1].data == ("2:OPEN", "3:FAILED", "4:OPEN")
    assert replies[2] is not None and replies[2].code == "IIAC"
