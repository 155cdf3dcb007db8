"""Optical circuit switch (OCS) model: circuits, crossconnect state and the driver interface.

Everything here is pure data and rules, shared by every OCS back end (emulated on OVS, simulated
under a virtual clock, real hardware):

* a :class:`Circuit` joins two ports of one rail switch; it is undirected and normalised so that
  ``port_a < port_b``;
* a :class:`Reconfiguration` is one request on one rail: circuits to remove and to add;
* :class:`CrossconnectState` holds the current circuits of every rail and is the single
  implementation of the one-to-one rule: :meth:`CrossconnectState.check` rejects a request that
  would give a port two peers, names an unknown port, or removes a circuit that is not there, and
  raises :class:`ReconfigurationRejected` naming the rail and the ports; nothing changes then;
* :class:`OcsDriver` is the interface the Opus controller uses for every OCS.

Switching is break-before-make, as on glass: the ports a reconfiguration touches go
dark for the switching time, then the new circuits light; untouched circuits keep their light.
"""

from __future__ import annotations

import abc
import enum
import math
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

_new_tuple = tuple.__new__

#: Table 3 of the paper: OCS technology -> (switching time in ms, radix in ports).
TECHNOLOGIES: dict[str, tuple[float, int]] = {
    "plzt": (0.00001, 16),
    "sip": (0.007, 32),
    "rotornet": (0.01, 128),
    "3d-mems": (15.0, 320),
    "piezo": (25.0, 576),
    "liquid-crystal": (100.0, 512),
    "robotic": (120000.0, 1008),
}

#: Other names accepted for Table 3 technologies (vendors and spellings) -> the Table 3 key.
TECHNOLOGY_ALIASES = {
    "mems": "3d-mems",
    "3dmems": "3d-mems",
    "3d_mems": "3d-mems",
    "polatis": "piezo",
    "lc": "liquid-crystal",
    "liquid_crystal": "liquid-crystal",
    "lcos": "liquid-crystal",
    "telescent": "robotic",
    "calient": "3d-mems",
}


def resolve_switching_delay_ms(value: float | int | str) -> float:
    """Return the switching delay in ms for a number or a Table 3 technology name.

    Raises ``ValueError`` naming the bad value and the known technologies.
    """
    if isinstance(value, bool):
        raise ValueError(f"switching delay must be a number of ms or a technology, not {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"switching delay must be a finite number >= 0 ms, got {value}")
        return float(value)
    key = str(value).strip().lower()
    try:
        number = float(key)
    except ValueError:
        pass
    else:
        return resolve_switching_delay_ms(number)
    key = TECHNOLOGY_ALIASES.get(key, key)
    if key not in TECHNOLOGIES:
        raise ValueError(f"unknown OCS technology {value!r}; known: {technology_words()}, "
                         "or a number of ms")
    return TECHNOLOGIES[key][0]


def technology_words() -> str:
    """Every word a switching delay accepts, each Table 3 name with its aliases (in Table 3's
    order, fastest first): ``plzt, sip, ..., 3d-mems (or 3d_mems, 3dmems, calient, mems), ...``."""
    words = []
    for name in TECHNOLOGIES:
        aliases = sorted(a for a, target in TECHNOLOGY_ALIASES.items() if target == name)
        words.append(f"{name} (or {', '.join(aliases)})" if aliases else name)
    return ", ".join(words)


def parse_delays_ms(text: str) -> list[float]:
    """A comma-separated list of switching delays, each what :func:`resolve_switching_delay_ms`
    takes (ms or a Table 3 name), as ms in the given order.

    Raises ``ValueError`` naming the bad item and its place, with the accepted words.
    """
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"no delay given in {text!r}; give ms or technology names separated "
                         "by commas, e.g. 0,10,sip")
    delays = []
    for place, item in enumerate(items, start=1):
        try:
            delays.append(resolve_switching_delay_ms(item))
        except ValueError as exc:
            raise ValueError(f"item {place} of {text!r}: {exc}") from None
    return delays


def light_at_s(t_dark_s: float, delay_ms: float) -> float:
    """When a switch's new circuits light: the switching delay counts from the removal.

    ``t_dark_s`` is when the switch applies the removal of the old circuits (their ports go
    dark at once, break-before-make). The one statement of the rule, for the simulated OCS
    (:mod:`controller.drivers.sim`) and the emulated one (:mod:`emulator.ocs_core`).
    """
    return t_dark_s + delay_ms / 1e3


class _CircuitFields(NamedTuple):
    rail: int
    port_a: int
    port_b: int


class Circuit(_CircuitFields):
    """An optical crossconnect between two ports of one rail switch (undirected).

    A frozen value, normalised so that ``port_a < port_b``: equal, hashed and ordered as the
    tuple ``(rail, port_a, port_b)`` it is (a named tuple), so that the controller's sets and
    dicts of circuits, which it touches on every event, hash and compare them in C.
    """

    __slots__ = ()

    def __new__(cls, rail: int, port_a: int, port_b: int) -> Circuit:
        if port_a == port_b:
            raise ValueError(f"rail {rail}: a circuit needs two ports, got {port_a} twice")
        if port_a > port_b:
            port_a, port_b = port_b, port_a
        return _new_tuple(cls, (rail, port_a, port_b))

    @property
    def ports(self) -> tuple[int, int]:
        return (self.port_a, self.port_b)

    def peer_of(self, port: int) -> int:
        if port == self.port_a:
            return self.port_b
        if port == self.port_b:
            return self.port_a
        raise ValueError(f"port {port} is not an end of {self}")

    def to_json(self) -> list[int]:
        return [self.port_a, self.port_b]

    def __str__(self) -> str:
        return f"rail{self.rail}:{self.port_a}<->{self.port_b}"


_EMPTY: frozenset[Circuit] = frozenset()


@dataclass(frozen=True, init=False)  # __init__: below
class Reconfiguration:
    """One request on one rail: circuits to remove, then circuits to add."""

    rail: int
    add: frozenset[Circuit] = field(default_factory=frozenset)
    remove: frozenset[Circuit] = field(default_factory=frozenset)

    def __init__(self, rail: int, add: frozenset[Circuit] = _EMPTY,
                 remove: frozenset[Circuit] = _EMPTY) -> None:
        # the generated __init__ of a frozen class sets each field through object.__setattr__;
        # the controller builds one per rail of every decision
        d = self.__dict__
        d["rail"] = rail
        d["add"] = add
        d["remove"] = remove

    @classmethod
    def of(
        cls,
        rail: int,
        add: Iterable[tuple[int, int] | Circuit] = (),
        remove: Iterable[tuple[int, int] | Circuit] = (),
    ) -> Reconfiguration:
        """Build from port pairs or circuits; every circuit must be on ``rail``."""
        return cls(rail, _circuits(rail, add), _circuits(rail, remove))

    @property
    def touched_ports(self) -> frozenset[int]:
        """Ports that go dark during this reconfiguration."""
        return frozenset(p for c in self.add | self.remove for p in c.ports)

    @property
    def is_empty(self) -> bool:
        return not self.add and not self.remove

    def to_json(self) -> dict[str, object]:
        return {
            "rail": self.rail,
            "add": [c.to_json() for c in sorted(self.add)],
            "remove": [c.to_json() for c in sorted(self.remove)],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Reconfiguration:
        """Parse the JSON form; raises ``ValueError`` naming the malformed field."""
        try:
            rail = data["rail"]
        except (KeyError, TypeError) as exc:
            raise ValueError("reconfiguration needs a 'rail'") from exc
        if not isinstance(rail, int) or isinstance(rail, bool):
            raise ValueError(f"'rail' must be an integer, got {rail!r}")
        pairs: dict[str, list[tuple[int, int]]] = {}
        for key in ("add", "remove"):
            raw = data.get(key, [])
            if not isinstance(raw, list):
                raise ValueError(f"rail {rail}: '{key}' must be a list of [port, port] pairs")
            parsed = []
            for item in raw:
                if (
                    not isinstance(item, list | tuple)
                    or len(item) != 2
                    or not all(isinstance(p, int) and not isinstance(p, bool) for p in item)
                    or item[0] == item[1]
                ):
                    raise ValueError(
                        f"rail {rail}: '{key}' entry {item!r} is not a [port, port] pair")
                parsed.append((int(item[0]), int(item[1])))
            pairs[key] = parsed
        return cls.of(rail, pairs["add"], pairs["remove"])


def _circuits(rail: int, items: Iterable[tuple[int, int] | Circuit]) -> frozenset[Circuit]:
    out = set()
    for item in items:
        if isinstance(item, Circuit):
            if item.rail != rail:
                raise ValueError(f"circuit {item} is not on rail {rail}")
            out.add(item)
        else:
            a, b = item
            out.add(Circuit(rail, a, b))
    return frozenset(out)


class ReconfigurationRejected(ValueError):
    """A request that breaks the OCS rules; carries the rail and the offending ports."""

    def __init__(self, rail: int, ports: Sequence[int], reason: str) -> None:
        self.rail = rail
        self.ports = tuple(sorted(set(ports)))
        self.reason = reason
        port_text = ", ".join(str(p) for p in self.ports)
        super().__init__(f"rail {rail}, port(s) {port_text}: {reason}")

    def to_json(self) -> dict[str, object]:
        return {"rail": self.rail, "ports": list(self.ports), "reason": self.reason,
                "error": str(self)}


class CrossconnectState:
    """Current circuits of every rail; the one implementation of the one-to-one rule."""

    def __init__(self, ports_by_rail: Mapping[int, Iterable[int]]) -> None:
        self._ports: dict[int, frozenset[int]] = {
            rail: frozenset(ports) for rail, ports in ports_by_rail.items()
        }
        self._peer: dict[int, dict[int, int]] = {rail: {} for rail in self._ports}

    @property
    def rails(self) -> list[int]:
        return sorted(self._ports)

    def ports(self, rail: int) -> frozenset[int]:
        self._require_rail(rail)
        return self._ports[rail]

    def peer(self, rail: int, port: int) -> int | None:
        self._require_rail(rail)
        return self._peer[rail].get(port)

    def peers(self, rail: int) -> Mapping[int, int]:
        """Port -> peer of every circuit on ``rail``: a live view, for lookups in a loop."""
        self._require_rail(rail)
        return self._peer[rail]

    def circuits(self, rail: int) -> frozenset[Circuit]:
        self._require_rail(rail)
        return frozenset(Circuit(rail, a, b) for a, b in self._peer[rail].items() if a < b)

    def all_circuits(self) -> frozenset[Circuit]:
        return frozenset(c for rail in self._ports for c in self.circuits(rail))

    def _require_rail(self, rail: int) -> None:
        if rail not in self._ports:
            raise ReconfigurationRejected(rail, [], f"no such rail (rails: {self.rails})")

    def check(self, reconf: Reconfiguration) -> None:
        """Raise :class:`ReconfigurationRejected` unless ``reconf`` keeps every port one-to-one."""
        rail = reconf.rail
        known = self._ports.get(rail)
        if known is None:
            self._require_rail(rail)  # raises
            return
        peers = self._peer[rail]
        if self._fits(reconf, known, peers):
            return
        unknown = [p for c in reconf.add | reconf.remove for p in c.ports if p not in known]
        if unknown:
            raise ReconfigurationRejected(rail, unknown, "no such port on this rail")
        missing = [c for c in reconf.remove if peers.get(c.port_a) != c.port_b]
        if missing:
            ports = [p for c in missing for p in c.ports]
            names = ", ".join(f"{c.port_a}<->{c.port_b}" for c in sorted(missing))
            raise ReconfigurationRejected(rail, ports, f"cannot remove absent circuit(s) {names}")
        freed = {p for c in reconf.remove for p in c.ports}
        used: dict[int, Circuit] = {}
        for c in sorted(reconf.add):
            for p in c.ports:
                if p in used:
                    raise ReconfigurationRejected(
                        rail, [p], f"two new circuits on one port ({used[p]} and {c})"
                    )
                used[p] = c
                if p in peers and p not in freed:
                    raise ReconfigurationRejected(
                        rail, [p, peers[p]],
                        f"port {p} already has peer {peers[p]}; remove that circuit first",
                    )

    @staticmethod
    def _fits(reconf: Reconfiguration, known: frozenset[int], peers: Mapping[int, int]) -> bool:
        """The rules of :meth:`check` without the error reports: True when ``reconf`` keeps
        every port one-to-one (the common case, checked without sorting); False sends
        :meth:`check` down its reporting path, which finds and names the violation."""
        freed = set()
        for c in reconf.remove:
            a, b = c.port_a, c.port_b
            if a not in known or b not in known or peers.get(a) != b:
                return False
            freed.add(a)
            freed.add(b)
        used = set()
        for c in reconf.add:
            for p in (c.port_a, c.port_b):
                if p not in known or p in used or (p in peers and p not in freed):
                    return False
                used.add(p)
        return True

    def apply(self, reconf: Reconfiguration) -> None:
        """Check ``reconf`` and commit it; on rejection nothing changes."""
        self.check(reconf)
        peers = self._peer[reconf.rail]
        for c in reconf.remove:
            del peers[c.port_a]
            del peers[c.port_b]
        for c in reconf.add:
            peers[c.port_a] = c.port_b
            peers[c.port_b] = c.port_a

    def check_all(self, reconfs: Sequence[Reconfiguration]) -> None:
        """Check a batch spanning several rails (at most one request per rail)."""
        seen: set[int] = set()
        for r in reconfs:
            if r.rail in seen:
                raise ReconfigurationRejected(r.rail, [], "two requests for one rail in a batch")
            seen.add(r.rail)
            self.check(r)

    def port_states(self, rail: int, dark: Container[int] = ()) -> dict[int, PortState]:
        """Light of every port: ``dark`` ports are being switched, others lit or idle."""
        ports = self.ports(rail)  # raises for an unknown rail
        peers = self._peer[rail]
        return {
            p: PortState.DARK if p in dark else PortState.LIT if p in peers else PortState.IDLE
            for p in sorted(ports)
        }

    def diff_to(self, rail: int, target: Iterable[Circuit]) -> Reconfiguration:
        """The minimal reconfiguration that turns the rail's circuits into ``target``."""
        current = self.circuits(rail)
        goal = frozenset(target)
        return Reconfiguration(rail, add=goal - current, remove=current - goal)


class PortState(enum.StrEnum):
    """What a port's light looks like now."""

    LIT = "lit"  # part of a circuit that carries light
    DARK = "dark"  # being switched: no light
    IDLE = "idle"  # no circuit
    FAILED = "failed"  # the switch reports the port failed (Polatis status, CALIENT INOC/OUTOC)


@dataclass(frozen=True)
class RailDescription:
    """Static facts of one rail switch."""

    rail: int
    ports: tuple[int, ...]
    switching_delay_ms: float
    mode: str = "ocs"  # "ocs" (one-to-one circuits) or "electrical" (all-to-all packet switch)

    def to_json(self) -> dict[str, object]:
        return {"rail": self.rail, "ports": list(self.ports),
                "switching_delay_ms": self.switching_delay_ms, "mode": self.mode}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RailDescription:
        ports = data["ports"]
        assert isinstance(ports, list)
        return cls(int(str(data["rail"])), tuple(int(p) for p in ports),
                   float(str(data["switching_delay_ms"])), str(data.get("mode", "ocs")))


@dataclass(frozen=True, init=False)  # __init__: below
class ApplyResult:
    """Outcome of one rail's reconfiguration, with timestamps in seconds of the driver's clock.

    ``t_request_s``: the request reached the switch; ``t_dark_s``: the switch began to break the
    old circuits (the touched ports go dark; the switching time runs from here);
    ``t_light_s``: the new circuits carry light (confirmed).
    """

    rail: int
    added: frozenset[Circuit]
    removed: frozenset[Circuit]
    t_request_s: float
    t_dark_s: float
    t_light_s: float

    def __init__(self, rail: int, added: frozenset[Circuit], removed: frozenset[Circuit],
                 t_request_s: float, t_dark_s: float, t_light_s: float) -> None:
        # the generated __init__ of a frozen class, without its six object.__setattr__ calls
        # (one result per rail of every decision)
        self.__dict__.update(rail=rail, added=added, removed=removed, t_request_s=t_request_s,
                             t_dark_s=t_dark_s, t_light_s=t_light_s)

    @property
    def dark_ms(self) -> float:
        return (self.t_light_s - self.t_dark_s) * 1e3

    def to_json(self) -> dict[str, object]:
        return {
            "rail": self.rail,
            "added": [c.to_json() for c in sorted(self.added)],
            "removed": [c.to_json() for c in sorted(self.removed)],
            "t_request_s": self.t_request_s,
            "t_dark_s": self.t_dark_s,
            "t_light_s": self.t_light_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ApplyResult:
        rail = int(str(data["rail"]))
        added = data["added"]
        removed = data["removed"]
        assert isinstance(added, list) and isinstance(removed, list)
        return cls(
            rail,
            frozenset(Circuit(rail, a, b) for a, b in added),
            frozenset(Circuit(rail, a, b) for a, b in removed),
            float(str(data["t_request_s"])),
            float(str(data["t_dark_s"])),
            float(str(data["t_light_s"])),
        )


class OcsDriver(abc.ABC):
    """What the Opus controller needs from any OCS: emulated, simulated or hardware.

    ``apply_many`` switches several rails as one decision: all requests are checked before any
    rail changes (all-or-nothing), then the rails switch concurrently.

    The contract every driver keeps, whatever its switch does underneath (vendors compared, and
    set against SAI's OCS object model, in ``docs/hardware.md``):

    * **Ports** are the rail's integers (a rank's duplex NIC port). A driver maps them onto its
      device's own names (Polatis: ingress ``p`` and egress ``N+p``; CALIENT: the ``p``-th
      dotted port) and never shows those names here.
    * **Circuits are duplex.** A :class:`Circuit` ``a <-> b`` carries light both ways, whether
      the switch builds it from two one-way cross-connects (Polatis pairs) or as one duplex
      connection (CALIENT ``2WAY``). Half of one (a one-way leftover, a connection reserved but
      not in service) is not a circuit: :meth:`circuits` leaves it out, :meth:`port_states`
      reads its ports ``DARK``, and the next request touching them clears it.
    * **Checks are all-or-nothing, the glass need not be.** A request that breaks the
      one-to-one rule raises :class:`ReconfigurationRejected` before anything is sent. After
      that a device may take one command per pair or connection (TL1); a device fault midway
      raises the driver's device error once the driver has re-read the rail, so
      :meth:`circuits` then says what is on the glass.
    * **Break before make.** Removals go first, then additions; ``t_light_s`` is when the switch
      confirmed that the new circuits carry light (a driver whose switch answers before its
      mirrors settle polls until the switch says so).
    * **Dark is a state, not a reading.** Each driver turns its device's signals into
      :class:`PortState`: ``DARK`` (a monitor below ``dark_below_dbm`` on a Polatis, ``NONE``
      on a CALIENT, a switch in flight), ``FAILED`` (the device reports the port failed).
    """

    @abc.abstractmethod
    def describe(self) -> list[RailDescription]:
        """Static facts of every rail: ports, switching time, mode."""

    @abc.abstractmethod
    def circuits(self, rail: int) -> frozenset[Circuit]:
        """Circuits currently set up on ``rail`` (lit or being switched on)."""

    @abc.abstractmethod
    def port_states(self, rail: int) -> dict[int, PortState]:
        """Light state of every port of ``rail``."""

    @abc.abstractmethod
    def apply_many(self, reconfs: Sequence[Reconfiguration]) -> list[ApplyResult]:
        """Reconfigure several rails as one decision; raises ReconfigurationRejected."""

    def switch_connections(self, rail: int) -> frozenset[tuple[int, int]]:
        """Every cross-connect on ``rail``'s switch as a pair of its ports (rail numbering),
        other users' included, one-way ones too: what :class:`controller.drivers.guard.PortGuard`
        reads before a run's first edit. The default, the driver's own circuits, is right for
        a driver that sees the whole switch; a driver that hides ports it does not drive
        (a lab switch shared by several users) must override it."""
        return frozenset(c.ports for c in self.circuits(rail))

    def apply(
        self,
        rail: int,
        add: Iterable[tuple[int, int] | Circuit] = (),
        remove: Iterable[tuple[int, int] | Circuit] = (),
    ) -> ApplyResult:
        """Reconfigure one rail: remove, wait the switching time, add."""
        return self.apply_many([Reconfiguration.of(rail, add, remove)])[0]

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the switch keeps its circuits."""

    def __enter__(self) -> OcsDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
