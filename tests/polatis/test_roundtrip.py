"""The Polatis drivers against the simulated switch, over NETCONF and TL1."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from controller.drivers.polatis.driver import PolatisDriver
from controller.drivers.registry import make_driver
from controller.ocs import (
    ApplyResult,
    Circuit,
    PortState,
    Reconfiguration,
    ReconfigurationRejected,
)
from emulator.network import wait_for
from emulator.polatis import NetconfServer, PolatisDevice, Tl1Server
from emulator.polatis.model import Change, TimedBackend

from .conftest import ENV, FINGERPRINT, PASSWORD, SIZE

Connect = Callable[..., PolatisDriver]


@pytest.fixture(params=["netconf", "tl1"])
def proto(request: pytest.FixtureRequest, netconf: NetconfServer,
          tl1: Tl1Server) -> tuple[str, int]:
    """Each test runs once per protocol, against the same simulated device."""
    server = netconf if request.param == "netconf" else tl1
    return request.param, server.port


def test_a_duplex_circuit_is_two_pairs_on_the_device(
        proto: tuple[str, int], device: PolatisDevice, connect: Connect) -> None:
    driver = connect(*proto)
    result = driver.apply(0, add=[(1, 3)])
    assert device.pairs() == {1: SIZE + 3, 3: SIZE + 1}
    assert driver.circuits(0) == {Circuit(0, 1, 3)}
    assert result.added == {Circuit(0, 1, 3)}
    assert result.t_request_s <= result.t_dark_s < result.t_light_s
    states = driver.port_states(0)
    assert states[1] == states[3] == PortState.LIT and states[2] == PortState.IDLE


def test_reconfiguration_removes_then_adds(
        proto: tuple[str, int], device: PolatisDevice, connect: Connect) -> None:
    driver = connect(*proto)
    driver.apply(0, add=[(1, 2), (3, 4)])
    driver.apply_many([Reconfiguration.of(0, add=[(1, 4), (2, 3)],
                                          remove=[(1, 2), (3, 4)])])
    assert driver.circuits(0) == {Circuit(0, 1, 4), Circuit(0, 2, 3)}
    assert device.pairs() == {1: SIZE + 4, 4: SIZE + 1, 2: SIZE + 3, 3: SIZE + 2}
    driver.apply(0, remove=[(1, 4)])
    assert device.pairs() == {2: SIZE + 3, 3: SIZE + 2}


def test_netconf_sends_one_edit_per_rail_batch(device: PolatisDevice, netconf: NetconfServer,
                                              connect: Connect) -> None:
    driver = connect("netconf", netconf.port)
    driver.apply(0, add=[(1, 2), (3, 4)])
    before = device.edits
    driver.apply_many([Reconfiguration.of(0, add=[(1, 3), (2, 4), (5, 6)],
                                          remove=[(1, 2), (3, 4)])])
    assert device.edits == before + 1


def test_both_protocols_serve_the_same_glass(device: PolatisDevice, netconf: NetconfServer,
                                             tl1: Tl1Server, connect: Connect) -> None:
    over_netconf = connect("netconf", netconf.port)
    over_tl1 = connect("tl1", tl1.port)
    over_netconf.apply(0, add=[(5, 6)])
    assert over_tl1.circuits(0) == {Circuit(0, 5, 6)}
    over_tl1.apply(0, remove=[(5, 6)], add=[(5, 7)])
    assert over_netconf.circuits(0) == {Circuit(0, 5, 7)}


def test_rule_violations_are_rejected_before_anything_is_sent(
        proto: tuple[str, int], device: PolatisDevice, connect: Connect) -> None:
    driver = connect(*proto)
    driver.apply(0, add=[(1, 2)])
    edits = device.edits
    for bad, ports in [(Reconfiguration.of(0, add=[(1, 5)]), {1, 2}),
                       (Reconfiguration.of(0, add=[(5, 9)]), {9}),
                       (Reconfiguration.of(0, remove=[(3, 4)]), {3, 4})]:
        with pytest.raises(ReconfigurationRejected) as err:
            driver.apply_many([bad])
        assert ports <= set(err.value.ports), str(err.value)
    assert device.edits == edits and device.pairs() == {1: SIZE + 2, 2: SIZE + 1}


def test_multi_rail_batch_is_checked_all_or_nothing_then_switched(device: PolatisDevice,
                                                                netconf: NetconfServer) -> None:
    second = PolatisDevice(4, switching_time_ms=5.0)
    with NetconfServer(second, password=PASSWORD) as other:
        config = {"driver": "polatis-netconf", "timeout_s": 5, "rails": [
            {"rail": 0, "host": "127.0.0.1", "port": netconf.port, "ports": [1, 2, 3, 4]},
            {"rail": 1, "host": "127.0.0.1", "port": other.port, "size": 4}],
            "host_key_fingerprint": FINGERPRINT}
        with make_driver(config, env=ENV) as driver:
            assert [(d.rail, d.ports) for d in driver.describe()] == [
                (0, (1, 2, 3, 4)), (1, (1, 2, 3, 4))]
            with pytest.raises(ReconfigurationRejected, match="rail 1"):
                driver.apply_many([Reconfiguration.of(0, add=[(1, 2)]),
                                   Reconfiguration.of(1, add=[(1, 7)])])
            assert device.pairs() == {} and second.pairs() == {}
            results = driver.apply_many([Reconfiguration.of(0, add=[(1, 2)]),
                                         Reconfiguration.of(1, add=[(3, 4)])])
            assert [r.rail for r in results] == [0, 1]
            assert device.pairs() == {1: SIZE + 2, 2: SIZE + 1}
            assert second.pairs() == {3: 8, 4: 7}


def test_touched_ports_read_dark_while_switching(
        proto: tuple[str, int], device: PolatisDevice, connect: Connect) -> None:
    """The device's monitors (read over a second session) and the driver both show it."""
    driver = connect(*proto)
    watcher = connect(*proto)
    driver.apply(0, add=[(1, 2), (3, 4)])
    device.backend.switching_s = 0.25
    results: list[ApplyResult] = []
    worker = threading.Thread(target=lambda: results.extend(driver.apply_many(
        [Reconfiguration.of(0, add=[(1, 5)], remove=[(1, 2)])])), daemon=True)
    worker.start()
    try:
        power = wait_for(lambda: (p := watcher.power_dbm(0)).get(SIZE + 1, 0) < -50 and p,
                         5, "egress of port 1 to read dark on the device")
        assert power[SIZE + 3] > -10 and power[SIZE + 4] > -10  # untouched: still lit
        seen = driver.port_states(0)
        assert seen[1] == seen[5] == PortState.DARK and seen[2] == PortState.DARK
        assert seen[3] == seen[4] == PortState.LIT
        assert driver.circuits(0) == {Circuit(0, 1, 5), Circuit(0, 3, 4)}
    finally:
        worker.join(timeout=10)
    assert not worker.is_alive(), "a 250 ms switch still running after 10 s"
    assert [r.added for r in results] == [{Circuit(0, 1, 5)}], "the switch failed (see above)"
    states = watcher.port_states(0)
    assert states[1] == states[5] == PortState.LIT and states[2] == PortState.IDLE


class WatchedBackend(TimedBackend):
    """The simulator's timed backend, noting when (wall clock, as the driver) each switch ran."""

    def __init__(self, switching_time_ms: float) -> None:
        super().__init__(switching_time_ms)
        self.windows_s: list[tuple[float, float]] = []

    def switch(self, change: Change) -> None:
        start_s = time.time()
        super().switch(change)
        self.windows_s.append((start_s, time.time()))




def test_switching_time_shows_in_the_result(device: PolatisDevice, netconf: NetconfServer,
                                            connect: Connect) -> None:
    device.backend = backend = WatchedBackend(50.0)
    driver = connect("netconf", netconf.port, switching_delay=50)
    t0 = time.monotonic()
    result = driver.apply(0, add=[(1, 2)])
    call_ms = (time.monotonic() - t0) * 1e3
    # the device, apart from the driver: it switched once, for its 50 ms, inside the window the
    # driver reports as dark; the reported dark time is no longer than the call as this test's
    # own clock saw it (the protocol's cost around the switch depends on the machine's load)
    (window,) = backend.windows_s
    assert result.t_dark_s <= window[0] and window[1] <= result.t_light_s, (result, window)
    assert window[1] - window[0] >= 0.05
    assert 50.0 <= result.dark_ms <= call_ms, (result.dark_ms, call_ms)
    assert driver.describe()[0].switching_delay_ms == 50.0


def test_old_revision_switch_is_driven_with_pairs() -> None:
    old = PolatisDevice(SIZE, revision="2016-03-11", switching_time_ms=0.0)
    with NetconfServer(old, password=PASSWORD) as server, make_driver(
            {"driver": "polatis-netconf", "host": "127.0.0.1", "port": server.port,
             "host_key_fingerprint": FINGERPRINT},
            env=ENV) as driver:
        assert driver.device_info(0).revision == "2016-03-11"
        driver.apply(0, add=[(2, 7)])
        assert old.pairs() == {2: SIZE + 7, 7: SIZE + 2}
        assert driver.circuits(0) == {Circuit(0, 2, 7)}
