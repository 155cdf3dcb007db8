"""A run touches only its own ports on a switch that another tenant shares.

The simulated switch is 8x8; the run owns rail ports 1-4 (``ocs.ports``), the other tenant
5-8. Rail port p is ingress p and egress 8+p; a duplex circuit a<->b is a->8+b and b->8+a.
"""

from __future__ import annotations

import json

import pytest

from controller.drivers.guard import PortConflict, PortGuard
from controller.drivers.registry import make_driver
from controller.drivers.sim import SimOcsDriver
from controller.ocs import Circuit, Reconfiguration, ReconfigurationRejected
from emulator.polatis import NetconfServer, PolatisDevice, Tl1Server
from testbed.cli import ocs as ocs_cli

from .conftest import ENV, SIZE, ocs_config

N = SIZE
RUN_PORTS = [1, 2, 3, 4]
TENANT_PORTS = [5, 6, 7, 8]
PROTOCOLS = ["netconf", "tl1"]


def _duplex(a: int, b: int) -> dict[int, int]:
    return {a: N + b, b: N + a}


def _port(protocol: str, netconf: NetconfServer, tl1: Tl1Server) -> int:
    return netconf.port if protocol == "netconf" else tl1.port


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("tenant", [_duplex(4, 7), {4: N + 7}, {7: N + 4}],
                         ids=["duplex", "from-run-port", "into-run-port"])
def test_another_tenants_circuit_on_a_run_port_refuses_the_start(
        protocol: str, tenant: dict[int, int], device: PolatisDevice, netconf: NetconfServer,
        tl1: Tl1Server) -> None:
    device.load({**tenant, **_duplex(5, 6)})
    before, edits = device.pairs(), device.edits
    with pytest.raises(PortConflict) as err:
        make_driver(ocs_config(protocol, _port(protocol, netconf, tl1), ports=RUN_PORTS),
                    env=ENV)
    assert "port 4 is cross-connected to port 7, which is not this run's" in str(err.value)
    assert "1-4" in str(err.value) and "port 5" not in str(err.value)
    assert device.pairs() == before and device.edits == edits


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_batch_naming_a_port_outside_the_run_is_refused_before_sending(
        protocol: str, device: PolatisDevice, netconf: NetconfServer, tl1: Tl1Server) -> None:
    device.load(_duplex(5, 6))
    with make_driver(ocs_config(protocol, _port(protocol, netconf, tl1), ports=RUN_PORTS),
                     env=ENV) as driver:
        edits = device.edits
        with pytest.raises(ReconfigurationRejected, match="not among this run's ports") as err:
            driver.apply_many([Reconfiguration.of(0, add=[(1, 2)], remove=[(5, 6)])])
        assert err.value.ports == (5, 6)
        with pytest.raises(ReconfigurationRejected, match="not among this run's ports"):
            driver.apply(0, add=[(4, 7)])
        assert device.edits == edits and device.pairs() == _duplex(5, 6)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_teardown_restores_what_the_run_found_and_nothing_else(
        protocol: str, device: PolatisDevice, netconf: NetconfServer, tl1: Tl1Server) -> None:
    port = _port(protocol, netconf, tl1)
    device.load({**_duplex(1, 2), **_duplex(5, 6)})  # the run's ports hold 1<->2 at its start
    run = make_driver(ocs_config(protocol, port, ports=RUN_PORTS), env=ENV)
    tenant = make_driver(ocs_config(protocol, port, ports=TENANT_PORTS), env=ENV,
                         restore_on_close=False)
    try:
        assert run.found == {0: frozenset({Circuit(0, 1, 2)})}
        run.apply(0, add=[(1, 3), (2, 4)], remove=[(1, 2)])
        tenant.apply(0, add=[(5, 8)], remove=[(5, 6)])  # the tenant works meanwhile
        assert device.pairs() == {**_duplex(1, 3), **_duplex(2, 4), **_duplex(5, 8)}
    finally:
        run.close()
        tenant.close()
    # the run's ports as it found them; the tenant's circuits as the tenant left them
    assert device.pairs() == {**_duplex(1, 2), **_duplex(5, 8)}


def test_teardown_leaves_a_port_another_tenant_took_meanwhile(device: PolatisDevice,
                                                               netconf: NetconfServer) -> None:
    device.load(_duplex(1, 2))
    with make_driver(ocs_config("netconf", netconf.port, ports=RUN_PORTS), env=ENV) as run:
        run.apply(0, remove=[(1, 2)])
        device.load({**device.pairs(), 2: N + 7})  # a tenant wrongly patches run port 2
    assert device.pairs() == {2: N + 7}  # not restored over it, and not deleted


def test_the_guard_covers_any_driver() -> None:
    """The rules are the guard's, not the vendor driver's: a driver that knows every port of
    the switch (here the simulated one) is kept to the run's ports all the same."""
    sim = SimOcsDriver({0: range(1, 9)}, 0.0)
    sim.apply(0, add=[(4, 7)])
    with pytest.raises(PortConflict, match="port 4 is cross-connected to port 7"):
        PortGuard(sim, {0: RUN_PORTS})
    sim.apply(0, remove=[(4, 7)], add=[(5, 6)])
    guard = PortGuard(sim, {0: RUN_PORTS}, restore_on_close=True)
    assert [d.ports for d in guard.describe()] == [(1, 2, 3, 4)]
    with pytest.raises(ReconfigurationRejected, match="not among this run's ports"):
        guard.apply(0, add=[(3, 5)])
    guard.apply(0, add=[(1, 2)])
    guard.close()
    assert sim.circuits(0) == {Circuit(0, 5, 6)}


def test_the_cli_keeps_to_its_ports(device: PolatisDevice, tl1: Tl1Server,
                                    capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPUS_OCS_PASSWORD", "root")
    device.load(_duplex(4, 7))
    target = ["--protocol", "tl1", "--host", "127.0.0.1", "--port", str(tl1.port),
              "--ports", "1-4"]
    assert ocs_cli.main(["status", *target, "--json"]) == 0  # reading is allowed
    (rail,) = json.loads(capsys.readouterr().out)["rails"]
    assert rail["conflicts"] == [[4, 7]]
    assert ocs_cli.main(["connect", "1", "2", *target]) == 1
    assert "refusing to start" in capsys.readouterr().err
    assert ocs_cli.main(["connect", "1", "5", *target[:-1], "1-3,6"]) == 1
    assert "not among this run's ports" in capsys.readouterr().err
    assert device.pairs() == _duplex(4, 7)


def test_a_failed_restore_does_not_hide_the_runs_own_error(
        device: PolatisDevice, netconf: NetconfServer, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(RuntimeError, match="the run failed"), \
            make_driver(ocs_config("netconf", netconf.port, ports=RUN_PORTS), env=ENV) as run:
        run.apply(0, add=[(1, 2)])
        netconf.stop()  # the switch goes away: teardown cannot restore
        raise RuntimeError("the run failed")
    assert "teardown could not restore" in caplog.text
