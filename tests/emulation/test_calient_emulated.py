"""The emulated OCS behind its CALIENT TL1 front, driven by the calient-tl1 driver."""

from __future__ import annotations

import time

import pytest
from dark_bounds import dark_bound_ms
from test_polatis_emulated import _circuit_flow, ocs_light_events

from controller.drivers.polatis.errors import DeviceRejected
from controller.drivers.registry import make_driver
from controller.ocs import Circuit, PortState, Reconfiguration
from emulator.calient.front import calient_fronts
from emulator.dataplane import ping_ok
from emulator.network import emulated_rails
from emulator.topo import RailSpec

PASSWORD = "front-secret"


def test_calient_tl1_driver_switches_real_ovs_circuits(no_leftovers: list[str]) -> None:
    spec = RailSpec(servers=4, gpus_per_server=1, ports_per_rank=1, link_mbps=None,
                    switching_delay=20)
    with emulated_rails(spec) as net, calient_fronts(net.driver, password=PASSWORD) as fronts:
        no_leftovers.append(net.prefix)
        p = {r: net.port(r) for r in range(4)}
        config = fronts.ocs_config(password_env="OPUS_TEST_FRONT_PW")
        assert config["driver"] == "calient-tl1"
        with make_driver(config, env={"OPUS_TEST_FRONT_PW": PASSWORD}) as driver:
            (desc,) = driver.describe()
            assert desc.ports == tuple(sorted(p.values())) and desc.switching_delay_ms == 20

            driver.apply(0, add=[(p[0], p[1])])
            assert net.driver.circuits(0) == {Circuit(0, p[0], p[1])}
            assert _circuit_flow(net, p[0], p[1]) and _circuit_flow(net, p[1], p[0])
            assert ping_ok(net, 0, 1) and not ping_ok(net, 0, 2)

            switched = len(ocs_light_events(net))
            t0 = time.monotonic()
            result = driver.apply_many([Reconfiguration.of(
                0, add=[(p[0], p[2]), (p[1], p[3])], remove=[(p[0], p[1])])])[0]
            call_ms = (time.monotonic() - t0) * 1e3
            # CANC-CRS darkens the old circuit, each ACT-CRS lights a new one: three switches
            # of the emulated OCS, each dark for its 20 ms, inside the window the driver reports
            events = ocs_light_events(net)[switched:]
            assert len(events) == 3, events
            for ocs in events:
                assert result.t_dark_s <= ocs["t_dark_s"] < ocs["t_light_s"] <= result.t_light_s
                assert 20.0 <= (ocs["t_light_s"] - ocs["t_dark_s"]) * 1e3 <= dark_bound_ms(20.0)
            assert 3 * 20.0 <= result.dark_ms <= call_ms, (result, call_ms)
            assert net.driver.circuits(0) == {Circuit(0, p[0], p[2]), Circuit(0, p[1], p[3])}
            assert not _circuit_flow(net, p[0], p[1])
            assert ping_ok(net, 0, 2) and ping_ok(net, 3, 1) and not ping_ok(net, 0, 1)
            assert driver.port_states(0) == {port: PortState.LIT for port in p.values()}

            # A circuit removed behind the front's back: the emulated OCS refuses the stale
            # CANC-CRS, the front takes the connection out of service, the driver re-reads it
            # as a stray half and deletes it in the next edit on its ports.
            net.driver.apply(0, remove=[(p[1], p[3])])
            with pytest.raises(DeviceRejected, match="emulated OCS refused"):
                driver.apply(0, remove=[(p[1], p[3])])
            assert net.driver.circuits(0) == {Circuit(0, p[0], p[2])}
            assert fronts.device(0).pairs() == {p[0]: 4 + p[2], p[2]: 4 + p[0]}
            assert driver.known_circuits(0) == {Circuit(0, p[0], p[2])}
            driver.apply(0, add=[(p[1], p[3])])
            assert ping_ok(net, 1, 3)
