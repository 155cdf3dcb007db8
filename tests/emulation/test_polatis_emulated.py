"""The emulated OCS behind its Polatis NETCONF front, driven by the polatis-netconf driver."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from dark_bounds import dark_bound_ms

from controller.drivers.polatis.errors import DeviceRejected
from controller.drivers.registry import make_driver
from controller.ocs import Circuit, PortState, Reconfiguration
from emulator import naming
from emulator.dataplane import ping_ok
from emulator.network import EmulatedRails, emulated_rails
from emulator.polatis.front import netconf_fronts
from emulator.topo import RailSpec

PASSWORD = "front-secret"


def ocs_light_events(net: EmulatedRails) -> list[dict[str, Any]]:
    """The emulated OCS's own record of each finished switch (its event log)."""
    lines = (net.run_dir / "ocs-events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "light"]


def _circuit_flow(net: EmulatedRails, src: int, dst: int) -> bool:
    """True if the rail bridge forwards port ``src`` to port ``dst`` (numbers or names)."""
    names = {p: (f"in_port={p}", f'in_port="{naming.bridge_port_intf(net.prefix, 0, p)}"',
                 f"output:{p}", f'output:"{naming.bridge_port_intf(net.prefix, 0, p)}"')
             for p in (src, dst)}
    return any(any(m in flow for m in names[src][:2]) and any(m in flow for m in names[dst][2:])
               for flow in net.dump_flows(0))


def test_polatis_netconf_driver_switches_real_ovs_circuits(no_leftovers: list[str]) -> None:
    spec = RailSpec(servers=4, gpus_per_server=1, ports_per_rank=1, link_mbps=None,
                    switching_delay=20)
    with emulated_rails(spec) as net, netconf_fronts(net.driver, password=PASSWORD) as fronts:
        no_leftovers.append(net.prefix)
        p = {r: net.port(r) for r in range(4)}
        config = fronts.ocs_config(password_env="OPUS_TEST_FRONT_PW")
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
            # the emulated OCS switched once, dark for its 20 ms (plus its own cost), inside the
            # window the driver reports, which is no longer than the call as this test's own
            # clock saw it (NETCONF's cost around the switch depends on the machine's load)
            (ocs,) = ocs_light_events(net)[switched:]
            assert result.t_dark_s <= ocs["t_dark_s"] < ocs["t_light_s"] <= result.t_light_s
            ocs_dark_ms = (ocs["t_light_s"] - ocs["t_dark_s"]) * 1e3
            assert 20.0 <= ocs_dark_ms <= dark_bound_ms(20.0), ocs
            assert ocs_dark_ms <= result.dark_ms <= call_ms, (result, ocs, call_ms)
            assert net.driver.circuits(0) == {Circuit(0, p[0], p[2]), Circuit(0, p[1], p[3])}
            assert not _circuit_flow(net, p[0], p[1])
            assert ping_ok(net, 0, 2) and ping_ok(net, 3, 1) and not ping_ok(net, 0, 1)
            assert driver.port_states(0) == {port: PortState.LIT for port in p.values()}

            # A circuit removed behind the front's back: the emulated OCS refuses the stale
            # request, the front re-reads the rail, and so does the driver.
            net.driver.apply(0, remove=[(p[1], p[3])])
            with pytest.raises(DeviceRejected, match="emulated OCS refused"):
                driver.apply(0, remove=[(p[1], p[3])])
            assert net.driver.circuits(0) == {Circuit(0, p[0], p[2])}
            assert fronts.device(0).pairs() == {p[0]: 4 + p[2], p[2]: 4 + p[0]}
            assert driver.known_circuits(0) == {Circuit(0, p[0], p[2])}
            driver.apply(0, add=[(p[1], p[3])])
            assert ping_ok(net, 1, 3)
