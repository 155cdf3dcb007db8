"""The emulated OCS behind a Polatis NETCONF or TL1 front: one simulated device per rail, real
circuits.

Each rail of a running emulation gets a :class:`~emulator.polatis.model.PolatisDevice` whose
backend is :class:`EmulatedRailBackend`: an accepted edit becomes one
:class:`~controller.ocs.Reconfiguration` on the emulated OCS (real OpenFlow flows on the rail's
OVS bridge, host routes updated, the rail's injected switching delay), and the reply is sent
once the new circuits carry light. So ``driver: polatis-netconf`` or ``polatis-tl1`` pointed at
these servers drives real circuits through the same code path as a lab switch.

Port mapping as everywhere (:mod:`controller.drivers.polatis.ports`): the device is N x N with N
the rail's highest port; rail port ``p`` is ingress ``p`` and egress ``N+p``. The emulated OCS
switches duplex circuits only:

* NETCONF edits come in batches, so an edit that would leave a one-way pair is refused
  (``operation-failed``);
* TL1 has no batches (one ENT-PATCH or DLT-PATCH per pair), so a duplex circuit is half made
  after its first command. The TL1 front accepts one-way pairs and keeps them dark: a circuit
  lights on the emulated OCS when its second pair is made, and goes dark when its first pair is
  deleted. A reconfiguration over TL1 therefore takes one switching delay per circuit it
  removes or adds, where NETCONF's one batched edit takes one per rail.

While the fronts run they own the rails: circuits changed behind their back (straight through
the emulated OCS API) are seen only when the emulated OCS refuses an edit -- the front then
re-reads the rail, so its glass matches the real circuits again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.drivers.config import DEFAULT_PASSWORD_ENV
from controller.drivers.polatis.ports import PortMap
from controller.drivers.polatis.xml import CURRENT_REVISION
from controller.ocs import OcsDriver, RailDescription, Reconfiguration, ReconfigurationRejected
from emulator.polatis.model import Change, DeviceError, PolatisDevice
from emulator.polatis.netconf_server import NetconfServer
from emulator.polatis.tl1_server import Tl1Server


class EmulatedRailBackend:
    """Realises a device edit as one duplex reconfiguration on the emulated OCS.

    ``one_way_pairs``: accept edits that leave a pair without its reverse (TL1) and keep such
    pairs dark, instead of refusing them (NETCONF).
    """

    switching_s: float | None = None  # dark until the emulated OCS confirms the light

    def __init__(self, driver: OcsDriver, portmap: PortMap, *, one_way_pairs: bool = False
                 ) -> None:
        self.driver = driver
        self.portmap = portmap
        self.one_way_pairs = one_way_pairs

    def validate(self, before: Mapping[int, int], after: Mapping[int, int]) -> None:
        view = self.portmap.decode(after)
        if view.stray and not self.one_way_pairs:
            pairs = ", ".join(f"{i}->{e}" for i, e in sorted(view.stray_pairs))
            ports = sorted({p for pair in view.stray_pairs for p in pair})
            raise DeviceError("operation-failed", f"the emulated OCS switches duplex circuits "
                              f"only; pair(s) {pairs} have no reverse pair on rail "
                              f"{self.portmap.rail} (rail port p = ingress p + egress "
                              f"{self.portmap.size}+p)", ports=ports)

    def switch(self, change: Change) -> None:
        old = self.portmap.decode(change.before).circuits
        new = self.portmap.decode(change.after).circuits
        reconf = Reconfiguration(self.portmap.rail, add=new - old, remove=old - new)
        if reconf.is_empty:
            return
        try:
            self.driver.apply_many([reconf])
        except ReconfigurationRejected as exc:  # perform() then adopts current()
            raise DeviceError("operation-failed", f"emulated OCS refused: {exc}",
                              ports=[p for port in exc.ports for p in
                                     (self.portmap.ingress(port), self.portmap.egress(port))]
                              ) from None

    def current(self) -> Mapping[int, int]:
        """The rail's real circuits, as device pairs."""
        return dict(self.portmap.pairs_of_all(self.driver.circuits(self.portmap.rail)))


#: the drivers whose fronts this module serves (:mod:`emulator.fronts` serves every vendor's)
POLATIS_DRIVERS = ("polatis-netconf", "polatis-tl1")


class FrontServer(Protocol):
    """What :class:`EmulatedFronts` needs of a rail's server (a Polatis or CALIENT agent)."""

    host: str
    port: int
    device: Any  # the simulated device: its ``size`` and an :class:`EmulatedRailBackend`

    def start(self, timeout_s: float = ...) -> object: ...

    def stop(self, timeout_s: float = ...) -> None: ...


@dataclass
class EmulatedFronts:
    """The running fronts: one management server (and simulated device) per rail."""

    servers: Mapping[int, FrontServer]
    username: str
    switching_delay_ms: dict[int, float] = field(default_factory=dict)
    driver: str = "polatis-netconf"

    def device(self, rail: int) -> Any:
        """The rail's simulated device (a PolatisDevice, or a CalientDevice)."""
        return self.servers[rail].device

    def ocs_config(self, *, password_env: str = DEFAULT_PASSWORD_ENV,
                   timeout_s: float = 30.0) -> dict[str, Any]:
        """An ``ocs:`` mapping for :attr:`driver` pointing at these fronts (a NETCONF
        front's host key pinned, as a lab switch's must be)."""
        rails = []
        for rail, server in sorted(self.servers.items()):
            pm = server.device.backend
            assert isinstance(pm, EmulatedRailBackend)
            entry: dict[str, Any] = {
                "rail": rail, "host": server.host, "port": server.port,
                "size": server.device.size, "ports": list(pm.portmap.ports),
                "switching_delay": self.switching_delay_ms.get(rail, 0.0)}
            if isinstance(server, NetconfServer):  # the front's own key, pinned
                entry["host_key_fingerprint"] = server.host_key_fingerprint
            rails.append(entry)
        return {"driver": self.driver, "username": self.username,
                "password_env": password_env, "timeout_s": timeout_s, "rails": rails}


@contextlib.contextmanager
def emulated_fronts(driver: OcsDriver, ocs_driver: str = "polatis-netconf", *,
                    username: str = "admin", password: str = "root", host: str = "127.0.0.1",
                    revision: str = CURRENT_REVISION, rails: list[int] | None = None
                    ) -> Iterator[EmulatedFronts]:
    """Start a front for each (or each listed) OCS rail of ``driver``, speaking the protocol of
    ``ocs_driver`` (``polatis-netconf`` or ``polatis-tl1``); always stops them."""
    if ocs_driver not in POLATIS_DRIVERS:
        raise ValueError(f"no emulated Polatis front for driver {ocs_driver!r}; these fronts "
                         f"serve {', '.join(POLATIS_DRIVERS)}")
    protocol = ocs_driver.removeprefix("polatis-")

    def make(desc: RailDescription, pm: PortMap) -> FrontServer:
        backend = EmulatedRailBackend(driver, pm, one_way_pairs=protocol == "tl1")
        device = PolatisDevice(pm.size, revision=revision, backend=backend,
                               switching_time_ms=desc.switching_delay_ms,
                               serial=f"EMU-RAIL{desc.rail}")
        device.load(dict(pm.pairs_of_all(driver.circuits(desc.rail))))
        if protocol == "tl1":
            return Tl1Server(device, host=host, port=0, username=username, password=password)
        return NetconfServer(device, host=host, port=0, username=username, password=password)

    with rail_fronts(driver, make, username=username, ocs_driver=ocs_driver,
                     rails=rails) as fronts:
        yield fronts


@contextlib.contextmanager
def rail_fronts(driver: OcsDriver, make: Callable[[RailDescription, PortMap], FrontServer], *,
                username: str, ocs_driver: str, rails: list[int] | None = None
                ) -> Iterator[EmulatedFronts]:
    """Start the server ``make`` builds for each (or each listed) OCS rail of ``driver``, given
    the rail and its :class:`PortMap` (size = the rail's highest port); always stops them.
    Every vendor's fronts start and stop here."""
    servers: dict[int, FrontServer] = {}
    delays: dict[int, float] = {}
    try:
        for desc in driver.describe():
            if desc.mode != "ocs" or (rails is not None and desc.rail not in rails):
                continue
            pm = PortMap(desc.rail, max(desc.ports), tuple(desc.ports))
            server = make(desc, pm)
            servers[desc.rail] = server
            delays[desc.rail] = desc.switching_delay_ms
            server.start()
        yield EmulatedFronts(servers, username, delays, ocs_driver)
    finally:
        for server in servers.values():
            server.stop()


def netconf_fronts(driver: OcsDriver, **options: Any
                   ) -> contextlib.AbstractContextManager[EmulatedFronts]:
    """:func:`emulated_fronts` speaking NETCONF (``driver: polatis-netconf``)."""
    return emulated_fronts(driver, "polatis-netconf", **options)
