"""The port guard covers the CALIENT driver by construction: another tenant's connection on a
run's port refuses the start, a batch naming another port is refused before anything is sent,
and teardown restores the run's ports only."""

from __future__ import annotations

import pytest

from controller.drivers.guard import PortConflict
from controller.drivers.registry import make_driver
from controller.ocs import ReconfigurationRejected
from emulator.calient.model import CalientDevice
from emulator.calient.tl1_server import CalientTl1Server

from .conftest import ENV, SIZE, ocs_config

N = SIZE
RUN_PORTS = [1, 2, 3, 4]


def _duplex(a: int, b: int) -> dict[int, int]:
    return {a: N + b, b: N + a}


@pytest.mark.parametrize("tenant", [_duplex(4, 7), {4: N + 7}], ids=["2way", "1way"])
def test_another_tenants_connection_on_a_run_port_refuses_the_start(
        tenant: dict[int, int], device: CalientDevice, tl1: CalientTl1Server) -> None:
    device.load(tenant)
    before = sorted(device.connections())
    with pytest.raises(PortConflict, match="port 4 is cross-connected to port 7"):
        make_driver(ocs_config(tl1.port, ports=RUN_PORTS), env=ENV)
    assert sorted(device.connections()) == before


def test_batches_and_teardown_keep_to_the_runs_ports(device: CalientDevice,
                                                     tl1: CalientTl1Server) -> None:
    device.load({**_duplex(1, 2), **_duplex(5, 6)})
    with make_driver(ocs_config(tl1.port, ports=RUN_PORTS), env=ENV) as run:
        with pytest.raises(ReconfigurationRejected, match="not among this run's ports"):
            run.apply(0, add=[(3, 5)])
        run.apply(0, add=[(1, 3), (2, 4)], remove=[(1, 2)])
        assert len(device.connections()) == 3
    assert sorted(device.connections()) == ["1.1.1-1.1.2", "1.1.5-1.1.6"]  # restored
