"""emulator.polatis.front: Polatis NETCONF and TL1 fronts over an OCS driver (no root).

The fronts serve any :class:`~controller.ocs.OcsDriver`; here a simulated one on the wall clock
stands in for the emulated OCS (tests/emulation drives real OVS circuits through them).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from controller.drivers.registry import HARDWARE_DRIVERS, make_driver
from controller.drivers.sim import SimOcsDriver
from controller.ocs import ApplyResult, Circuit, Reconfiguration
from emulator.fronts import emulated_fronts
from emulator.polatis.model import DeviceError, EditOp

PASSWORD = "front-test"
PORTS = (1, 2, 3, 4)


class CountingOcs(SimOcsDriver):
    """A simulated OCS that counts the reconfigurations it is asked to switch."""

    switches = 0

    def apply_many(self, reconfs: Sequence[Reconfiguration]) -> list[ApplyResult]:
        self.switches += len(reconfs)
        return super().apply_many(reconfs)


def ocs() -> CountingOcs:
    return CountingOcs({0: PORTS}, switching_delay=1.0)


@pytest.mark.parametrize("ocs_driver", HARDWARE_DRIVERS)
def test_a_polatis_driver_switches_the_ocs_behind_its_front(ocs_driver: str) -> None:
    rail = ocs()
    with emulated_fronts(rail, ocs_driver, password=PASSWORD) as fronts:
        config = fronts.ocs_config(password_env="FRONT_PW")
        assert config["driver"] == ocs_driver
        with make_driver(config, env={"FRONT_PW": PASSWORD}) as driver:
            driver.apply(0, add=[(1, 2), (3, 4)])
            assert rail.circuits(0) == {Circuit(0, 1, 2), Circuit(0, 3, 4)}
            before = rail.switches
            driver.apply_many([Reconfiguration.of(0, add=[(1, 3), (2, 4)],
                                                  remove=[(1, 2), (3, 4)])])
            assert rail.circuits(0) == {Circuit(0, 1, 3), Circuit(0, 2, 4)}
            assert driver.known_circuits(0) == rail.circuits(0)
            switches = rail.switches - before
    # NETCONF sends the rail's whole batch as one edit: one switch. Polatis TL1 sends one
    # command per pair: each circuit goes dark with its first deleted pair and lights with its
    # second added pair; CALIENT's CANC-CRS darkens a circuit and ACT-CRS lights one. So the
    # swap of two circuits for two is four switches over TL1.
    assert switches == (1 if ocs_driver == "polatis-netconf" else 4)


def test_tl1_front_keeps_a_one_way_pair_dark_and_netconf_front_refuses_it() -> None:
    rail = ocs()
    with emulated_fronts(rail, "polatis-tl1") as fronts:
        device = fronts.device(0)
        device.perform([EditOp("create", 1, 4 + 2)])  # ingress 1 -> egress of port 2 only
        assert device.pairs() == {1: 6} and rail.circuits(0) == frozenset()
        device.perform([EditOp("create", 2, 4 + 1)])  # the reverse pair: the circuit lights
        assert rail.circuits(0) == {Circuit(0, 1, 2)}
        device.perform([EditOp("delete", 1)])  # half gone: dark on the OCS
        assert device.pairs() == {2: 5} and rail.circuits(0) == frozenset()
    with emulated_fronts(rail, "polatis-netconf") as fronts:
        with pytest.raises(DeviceError, match="duplex circuits only"):
            fronts.device(0).perform([EditOp("create", 1, 4 + 2)])
        assert fronts.device(0).pairs() == {} and rail.circuits(0) == frozenset()


def test_a_front_for_an_unknown_driver_is_refused() -> None:
    with pytest.raises(ValueError, match="no emulated front for driver 'emulated'"), \
            emulated_fronts(ocs(), "emulated"):
        pass
