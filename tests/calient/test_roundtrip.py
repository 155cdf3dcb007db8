"""The calient-tl1 driver against the simulated switch over TCP: set, read, swap, light."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from controller.drivers.polatis.driver import PolatisDriver
from controller.drivers.polatis.tl1 import Tl1Framer, parse_reply
from controller.ocs import Circuit, PortState, Reconfiguration
from emulator.calient.model import CalientDevice
from emulator.calient.tl1_server import CalientTl1Server

from .conftest import SIZE

Connect = Callable[..., PolatisDriver]


def test_facts_set_read_and_swap(device: CalientDevice, tl1: CalientTl1Server,
                                 connect: Connect) -> None:
    driver = connect(tl1.port)
    info = driver.device_info(0)
    assert (info.model, info.size, info.protocol, info.serial) == (
        f"S{SIZE}-SIM", SIZE, "tl1", "SIM000001")
    assert driver.device_name(0) == f"calient-tl1 127.0.0.1:{tl1.port}"
    (desc,) = driver.describe()
    assert desc.ports == tuple(range(1, SIZE + 1)) and desc.switching_delay_ms == 200.0

    driver.apply(0, add=[(1, 2), (3, 4)])
    assert sorted(device.connections()) == ["1.1.1-1.1.2", "1.1.3-1.1.4"]
    assert all(c.two_way and c.active for c in device.connections().values())
    assert driver.circuits(0) == {Circuit(0, 1, 2), Circuit(0, 3, 4)}
    states = driver.port_states(0)
    assert states[1] == states[2] == states[3] == states[4] == PortState.LIT
    assert states[5] == PortState.IDLE

    result = driver.apply_many([Reconfiguration.of(0, add=[(1, 3), (2, 4)],
                                                   remove=[(1, 2), (3, 4)])])[0]
    assert sorted(device.connections()) == ["1.1.1-1.1.3", "1.1.2-1.1.4"]
    assert driver.circuits(0) == {Circuit(0, 1, 3), Circuit(0, 2, 4)}
    # ACT-CRS is answered before the mirrors settle; the driver polls RTRV-CRS until both new
    # connections are in service, so the light it reports is the switch's (5 ms here)
    assert result.dark_ms >= 5.0
    driver.apply(0, remove=[(1, 3), (2, 4)])
    assert device.connections() == {} and driver.circuits(0) == frozenset()


def test_activations_sent_back_to_back_switch_together(connect: Connect) -> None:
    """Four circuits in one batch: one switching time, not four (a bulk switch)."""
    device = CalientDevice(SIZE, switching_time_ms=100.0)
    with CalientTl1Server(device, password="root") as server:
        driver = connect(server.port)
        t0 = time.monotonic()
        result = driver.apply(0, add=[(1, 2), (3, 4), (5, 6), (7, 8)])
        took_ms = (time.monotonic() - t0) * 1e3
    assert 100.0 <= result.dark_ms <= took_ms < 400.0, (result.dark_ms, took_ms)


def test_rail_ports_are_the_switchs_ports_in_shelf_slot_port_order(connect: Connect) -> None:
    device = CalientDevice(72, switching_time_ms=0)  # ports 1.1.1 .. 2.1.8
    with CalientTl1Server(device, password="root") as server:
        driver = connect(server.port, size=72, ports=[1, 9, 65, 72])
        driver.apply(0, add=[(1, 65), (9, 72)])
    assert sorted(device.connections()) == ["1.1.1-2.1.1", "1.2.1-2.1.8"]


def test_a_raw_client_speaks_to_the_simulator_as_public_clients_did(
        device: CalientDevice, tl1: CalientTl1Server) -> None:
    """Forms of QualiSystems' handler (group and name in ACT-CRS) and phosphorus' (DLT-CRS with
    the SYSTEM group) and MonALISA's (DLT-CRS by name, no AID) all reach the same connection."""
    device.load({5: SIZE + 6, 6: SIZE + 5})  # 5-6 stays: a query for 1-2 must not list it
    commands = ["ACT-USER::admin:1::root;",
                "ENT-CRS::1.1.1,1.1.2:2::Quali,2WAY;",
                "ACT-CRS::1.1.1,1.1.2:3::1.1.1-1.1.2,Quali;",
                "RTRV-CRS:::4::ALL;",
                "CANC-CRS::1.1.1,1.1.2:5::,Quali,1.1.1-1.1.2;",
                "DLT-CRS:::6::1.1.1-1.1.2;",
                "ENT-CRS::1.1.3,1.1.4:7::,1way;",
                "DLT-CRS::1.1.3,1.1.4:8::,SYSTEM,1.1.3>1.1.4;",
                "RTRV-CRS::1.1.1,1.1.2:9::;",
                "ENT-CRS::1.1.1,1.1.9:10::,2WAY;"]
    with socket.create_connection(("127.0.0.1", tl1.port), timeout=5) as s:
        s.sendall("".join(commands).encode())
        framer, messages = Tl1Framer(), []
        while len(messages) < len(commands):
            messages += framer.feed(s.recv(4096).decode())
    replies = [parse_reply(m) for m in messages]
    assert all(r is not None for r in replies)
    assert [r.ok for r in replies if r] == [True] * 9 + [False]
    listed = replies[3]
    assert listed is not None and listed.data[0].startswith(
        "1.1.1-1.1.2:SRCPORT=1.1.1,DSTPORT=1.1.2,GRPNAME=Quali,CONNNAME=1.1.1-1.1.2,"
        "CONNTYPE=2WAY,AS=IS,")
    assert replies[8] is not None and replies[8].data == ()
    assert replies[9] is not None and replies[9].code == "IIAC"
    assert sorted(device.connections()) == ["1.1.5-1.1.6"]
