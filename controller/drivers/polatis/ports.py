"""How rail ports map onto the ports of a Polatis N x N switch, written once.

A Polatis N x N switch has ingress ports ``1..N`` and egress ports ``N+1..2N``; light enters an
ingress and leaves by the egress it is cross-connected to. One rail port ``p`` (a rank's duplex
NIC port, ``1 <= p <= N``) is cabled as

* its transmit fibre into **ingress** ``p``, and
* its receive fibre out of **egress** ``N + p``.

A duplex rail circuit ``a <-> b`` is therefore the two unidirectional pairs
``a -> N+b`` and ``b -> N+a``. The simulator, the emulated OCS's NETCONF front and both drivers
use this mapping and nothing else.

Reading a device back, pairs fall in three kinds: both directions of ``a <-> b`` present (a
circuit), one direction only (a *stray* half, e.g. left by a session dropped mid-batch), or a
pair on device ports outside the rail (foreign: someone else's patch, ignored). A stray pair
blocks both rail ports it touches from carrying a circuit; the driver deletes strays on the
ports a request touches in the same edit that sets them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controller.ocs import Circuit


@dataclass(frozen=True)
class DeviceView:
    """A rail's cross-connects as read from the device."""

    circuits: frozenset[Circuit]
    #: device pairs (ingress, egress) that are not part of a full circuit, by rail port touched
    stray: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    @property
    def stray_pairs(self) -> frozenset[tuple[int, int]]:
        return frozenset(p for pairs in self.stray.values() for p in pairs)


@dataclass(frozen=True)
class PortMap:
    """Rail ``rail``'s ports ``ports`` on an N x N device of ``size`` N."""

    rail: int
    size: int
    ports: tuple[int, ...]

    def __post_init__(self) -> None:
        bad = [p for p in self.ports if not 1 <= p <= self.size]
        if bad:
            raise ValueError(f"rail {self.rail}: port(s) {bad} do not fit a "
                             f"{self.size}x{self.size} switch (ports 1..{self.size})")

    def ingress(self, port: int) -> int:
        return port

    def egress(self, port: int) -> int:
        return self.size + port

    def rail_port(self, device_port: int) -> int | None:
        """The rail port behind a device port, or None if it is not one of the rail's."""
        p = device_port - self.size if device_port > self.size else device_port
        return p if p in self.ports and 1 <= device_port <= 2 * self.size else None

    def pairs_of(self, circuit: Circuit) -> tuple[tuple[int, int], tuple[int, int]]:
        """The two unidirectional device pairs of a duplex circuit."""
        a, b = circuit.ports
        return (self.ingress(a), self.egress(b)), (self.ingress(b), self.egress(a))

    def pairs_of_all(self, circuits: Iterable[Circuit]) -> list[tuple[int, int]]:
        return sorted(p for c in circuits for p in self.pairs_of(c))

    def decode(self, pairs: Mapping[int, int]) -> DeviceView:
        """Split the device's ``ingress -> egress`` pairs into circuits and stray halves."""
        ports = set(self.ports)
        half: dict[int, int] = {}  # rail port a -> rail port b for a pair a -> N+b
        stray: dict[int, list[tuple[int, int]]] = {}
        for ingress, egress in pairs.items():
            src = ingress if ingress in ports else None
            dst = egress - self.size if self.size < egress <= 2 * self.size else None
            dst = dst if dst in ports else None
            if src is not None and dst is not None and src != dst:
                half[src] = dst
            elif src is not None or dst is not None:
                for p in {src, dst} - {None}:
                    assert p is not None
                    stray.setdefault(p, []).append((ingress, egress))
        circuits = set()
        for a, b in half.items():
            if half.get(b) == a:
                circuits.add(Circuit(self.rail, a, b))
            else:
                for p in (a, b):
                    stray.setdefault(p, []).append((self.ingress(a), self.egress(b)))
        return DeviceView(frozenset(circuits),
                          {p: tuple(sorted(set(v))) for p, v in sorted(stray.items())})
