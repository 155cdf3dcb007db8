"""One management session to one Polatis device: the interface both protocols implement.

The driver (:mod:`.driver`) speaks only in device terms through this interface: ``ingress ->
egress`` pairs, device port numbers, one batched edit at a time. NETCONF (:mod:`.netconf`) and
TL1 (:mod:`.tl1`) sessions implement it; every failure surfaces as a
:class:`~controller.drivers.polatis.errors.PolatisError` subclass naming the device.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceInfo:
    """What a device says about itself once logged in."""

    model: str
    ingress_ports: int
    egress_ports: int
    protocol: str  # "netconf" or "tl1"
    revision: str | None = None  # optical-switch YANG revision (NETCONF only)
    serial: str = ""
    software: str = ""

    @property
    def size(self) -> int:
        """N of an N x N switch (the ingress count)."""
        return self.ingress_ports

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "size": f"{self.ingress_ports}x{self.egress_ports}",
                "protocol": self.protocol, "revision": self.revision, "serial": self.serial,
                "software": self.software}


class DeviceSession(abc.ABC):
    """A login on one device. Not required to be thread-safe for edits; reads may overlap."""

    def __init__(self, protocol: str, host: str, port: int, *, username: str, password: str,
                 timeout_s: float) -> None:
        self.host = host
        self.port = port
        self.username = username
        self._password = password
        self.timeout_s = timeout_s
        #: ``host:port`` with the protocol, for error messages
        self.name = f"polatis-{protocol} {host}:{port}"

    @property
    @abc.abstractmethod
    def connected(self) -> bool:
        """True while the session is believed usable."""

    @abc.abstractmethod
    def open(self) -> DeviceInfo:
        """Connect and log in (closing any previous session first); return the device's facts."""

    @abc.abstractmethod
    def read_pairs(self) -> dict[int, int]:
        """All cross-connects as ``ingress -> egress``."""

    @abc.abstractmethod
    def edit(self, delete_ingress: Sequence[int], add: Sequence[tuple[int, int]]) -> None:
        """Delete the pairs on ``delete_ingress``, then create ``add``; returns once switched."""

    @abc.abstractmethod
    def power_dbm(self) -> dict[int, float]:
        """Measured optical power per device port (empty if the device has no monitors);
        ``-inf`` where the device says there is no light (a CALIENT ``NONE``)."""

    @abc.abstractmethod
    def port_status(self) -> dict[int, str]:
        """Status per device port (ENABLED, DISABLED, FAILED; empty if not available)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Log out and disconnect; never raises."""
