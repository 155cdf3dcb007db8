"""A Polatis switch in software: the device model, its NETCONF and TL1 agents, and the fronts
that put the emulated OCS behind the same management protocols as a lab switch.

* :mod:`.model` -- :class:`PolatisDevice`: pure state, validation, switching time, faults;
* :mod:`.datastore`, :mod:`.framing` -- NETCONF data, subtree filters, edits, RFC 6242;
* :mod:`.netconf_server` / :mod:`.tl1_server` -- the agents (127.0.0.1, background thread or
  foreground);
* :mod:`.front` -- :func:`~.front.emulated_fronts`, one NETCONF or TL1 server per emulated rail.

``opus-testbed ocs simulate`` runs a device from the command line (:mod:`testbed.cli.ocs`).
"""

from emulator.polatis.model import DeviceError, EditOp, Faults, PolatisDevice
from emulator.polatis.netconf_server import NetconfServer
from emulator.polatis.tl1_server import Tl1Server

__all__ = ["DeviceError", "EditOp", "Faults", "NetconfServer", "PolatisDevice", "Tl1Server"]
