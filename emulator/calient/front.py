"""The emulated OCS behind a CALIENT TL1 front: one simulated switch per rail, real circuits.

Each OCS rail gets a :class:`~emulator.calient.model.CalientDevice` whose backend is the same
:class:`~emulator.polatis.front.EmulatedRailBackend` the Polatis fronts use (it sees lit
``ingress -> egress`` pairs: port ``p`` = ingress ``p``, egress ``N+p``, N the rail's highest
port). A ``2WAY`` connection is a duplex circuit: it lights on the emulated OCS when ``ACT-CRS``
puts it in service (the reply waits for the light) and goes dark when ``CANC-CRS`` or
``DLT-CRS`` takes it out; reserved and ``1WAY`` connections stay dark. A reconfiguration
therefore takes one switching delay per circuit it removes or adds, as over Polatis TL1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from controller.drivers.polatis.ports import PortMap
from controller.ocs import OcsDriver, RailDescription
from emulator.calient.model import CalientDevice
from emulator.calient.tl1_server import CalientTl1Server
from emulator.polatis.front import EmulatedFronts, EmulatedRailBackend, FrontServer, rail_fronts


@contextlib.contextmanager
def calient_fronts(driver: OcsDriver, *, username: str = "admin", password: str = "root",
                   host: str = "127.0.0.1", rails: list[int] | None = None
                   ) -> Iterator[EmulatedFronts]:
    """Start a CALIENT TL1 front for each (or each listed) OCS rail of ``driver``; always stops
    them. The fronts' :meth:`~EmulatedFronts.ocs_config` names ``calient-tl1``."""

    def make(desc: RailDescription, pm: PortMap) -> FrontServer:
        backend = EmulatedRailBackend(driver, pm, one_way_pairs=True)
        device = CalientDevice(pm.size, backend=backend, serial=f"EMU-RAIL{desc.rail}",
                               switching_time_ms=desc.switching_delay_ms)
        device.load(dict(pm.pairs_of_all(driver.circuits(desc.rail))))
        return CalientTl1Server(device, host=host, port=0, username=username, password=password)

    with rail_fronts(driver, make, username=username, ocs_driver="calient-tl1",
                     rails=rails) as fronts:
        yield fronts
