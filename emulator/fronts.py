"""The emulated OCS behind a lab switch's management protocol, for every hardware driver.

:func:`emulated_fronts` starts, on each OCS rail of a running emulation, the simulated switch
that ``ocs.driver`` talks to -- a Polatis NETCONF or TL1 agent
(:mod:`emulator.polatis.front`) or a CALIENT TL1 agent (:mod:`emulator.calient.front`) -- backed
by the rail's real OVS circuits, so the lab driver runs against real emulated light.
"""

from __future__ import annotations

import contextlib
from typing import Any

from controller.drivers.registry import HARDWARE_DRIVERS
from controller.ocs import OcsDriver
from emulator.calient.front import calient_fronts
from emulator.polatis.front import EmulatedFronts
from emulator.polatis.front import emulated_fronts as polatis_fronts


def emulated_fronts(driver: OcsDriver, ocs_driver: str, **options: Any
                    ) -> contextlib.AbstractContextManager[EmulatedFronts]:
    """Fronts speaking ``ocs_driver``'s protocol on ``driver``'s OCS rails (a context manager
    that always stops them). ``options``: ``username``, ``password``, ``host``, ``rails``."""
    if ocs_driver not in HARDWARE_DRIVERS:
        raise ValueError(f"no emulated front for driver {ocs_driver!r}; fronts serve "
                         f"{', '.join(HARDWARE_DRIVERS)}")
    if ocs_driver == "calient-tl1":
        return calient_fronts(driver, **options)
    return polatis_fronts(driver, ocs_driver, **options)
