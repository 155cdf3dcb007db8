"""emulator.calient.front: the CALIENT TL1 front over an OCS driver (no root).

A simulated OCS on the wall clock stands in for the emulated one (tests/emulation drives real
OVS circuits through the same front).
"""

from __future__ import annotations

from controller.drivers.registry import make_driver
from controller.drivers.sim import SimOcsDriver
from controller.ocs import Circuit
from emulator.calient.front import calient_fronts
from emulator.fronts import emulated_fronts

PORTS = (1, 2, 3, 4)


def test_reserved_and_one_way_connections_stay_dark_on_the_ocs() -> None:
    rail = SimOcsDriver({0: PORTS}, switching_delay=1.0)
    rail.apply(0, add=[(3, 4)])
    with calient_fronts(rail) as fronts:
        device = fronts.device(0)
        assert sorted(device.connections()) == ["1.1.3-1.1.4"]  # adopted, in service
        name = device.enter(1, 2, two_way=True)
        assert rail.circuits(0) == {Circuit(0, 3, 4)}  # reserved: nothing moved
        device.activate(name)  # the reply waits for the emulated OCS's light
        assert device.state_of(name, device.clock()).in_service
        assert rail.circuits(0) == {Circuit(0, 1, 2), Circuit(0, 3, 4)}
        device.cancel("1.1.3-1.1.4")  # out of service: dark, its ports still held
        assert rail.circuits(0) == {Circuit(0, 1, 2)}
        device.delete("1.1.3-1.1.4")
        one_way = device.enter(3, 4, two_way=False)
        device.activate(one_way)
        assert rail.circuits(0) == {Circuit(0, 1, 2)}  # half a circuit: dark on the OCS
        device.delete(name)
        assert rail.circuits(0) == frozenset()


def test_the_front_picked_by_driver_name_serves_the_calient_driver() -> None:
    rail = SimOcsDriver({0: PORTS}, switching_delay=1.0)
    with emulated_fronts(rail, "calient-tl1", password="pw") as fronts:
        config = fronts.ocs_config(password_env="FRONT_PW")
        assert config["driver"] == "calient-tl1"
        assert config["rails"][0]["ports"] == list(PORTS)
        with make_driver(config, env={"FRONT_PW": "pw"}) as driver:
            driver.apply(0, add=[(1, 4), (2, 3)])
            assert rail.circuits(0) == driver.known_circuits(0) == {
                Circuit(0, 1, 4), Circuit(0, 2, 3)}
