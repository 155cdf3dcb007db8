"""Pure core of the emulated OCS: the OpenFlow operations that realise each rail change.

No os-ken, no threads, no I/O: like FAUCET's ``Valve``, this module takes a change and returns
the operations the switch must perform, as typed values; the os-ken shell
(:mod:`emulator.ocs_app`) encodes them into messages, sends them and keeps the time. The
one-to-one rule itself lives in :class:`controller.ocs.CrossconnectState` (one implementation);
:class:`OcsRails` holds that state and refuses a request before producing any operation.

How a rail bridge behaves as an optical circuit switch:

* a circuit ``a<->b`` is two flows at :data:`CIRCUIT_PRIORITY`, ``in_port=a -> output:b`` and
  ``in_port=b -> output:a``; a port's circuit flow matches on ``in_port`` alone, so a strict
  delete on ``in_port`` at that priority removes exactly it;
* the table-miss flow of an OCS rail drops (as on glass: no flooding, no learning, no packet-in);
  an ``electrical`` rail is the baseline all-to-all learning switch, table-miss ``NORMAL``;
* set-up when a bridge connects: delete every flow of every table, install the table-miss flow
  and the flows of the rail's current circuits, barrier;
* a reconfiguration is break-before-make: delete the flows of the removed circuits, barrier (the
  touched ports are dark), wait the rail's switching delay, add the flows of the new circuits,
  barrier (light). Ports that the reconfiguration does not touch appear in no operation, so
  their flows are never modified. The delay counts from the dark barrier's reply, the moment
  the switch is known to have applied the removal: a real OCS's darkness starts when its
  mirrors move, and an emulated one must never light sooner than the delay after its ports
  went dark (``docs/wire.md``, "The dark edge"). The switch applies the removal somewhere
  between its sending and that reply, so the dark period is the delay plus at most that lag,
  never less.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Container, Iterable, Sequence
from dataclasses import dataclass

from controller.ocs import (
    Circuit,
    CrossconnectState,
    PortState,
    RailDescription,
    Reconfiguration,
    ReconfigurationRejected,
    light_at_s,
)

#: OpenFlow priority of circuit flows (table-miss flows sit at 0).
CIRCUIT_PRIORITY = 100


class BarrierKind(enum.StrEnum):
    """What a barrier confirms once the switch answers it."""

    SETUP = "setup"  # the table holds the base flows and the rail's circuits
    DARK = "dark"  # the removed circuits' flows are gone: the touched ports are dark
    LIGHT = "light"  # the new circuits' flows are in: they carry light


@dataclass(frozen=True)
class DeleteAllFlows:
    """Delete every flow of every table."""


@dataclass(frozen=True)
class TableMiss:
    """Install the priority-0 flow for packets no circuit matches: drop, or ``NORMAL``."""

    normal: bool


@dataclass(frozen=True)
class FlowAdd:
    """Add the circuit flow ``in_port -> output:out_port`` at :data:`CIRCUIT_PRIORITY`."""

    in_port: int
    out_port: int


@dataclass(frozen=True)
class FlowDelete:
    """Strictly delete the circuit flow matching ``in_port`` at :data:`CIRCUIT_PRIORITY`."""

    in_port: int


@dataclass(frozen=True)
class Barrier:
    """A barrier request: the switch has applied everything sent before it once it answers."""

    kind: BarrierKind


@dataclass(frozen=True)
class WaitDelay:
    """Let ``delay_ms`` (the switching time) pass since the removal is known applied: the
    reply to the :attr:`BarrierKind.DARK` barrier that precedes this wait."""

    delay_ms: float

    def until_s(self, t_applied_s: float) -> float:
        """When the wait ends for a sequence whose removal the switch confirmed applied at
        ``t_applied_s`` (the dark barrier's reply): the delay counts from the removal's
        effect, never from its sending (:func:`controller.ocs.light_at_s`)."""
        return light_at_s(t_applied_s, self.delay_ms)


FlowOperation = DeleteAllFlows | TableMiss | FlowAdd | FlowDelete
Operation = FlowOperation | Barrier | WaitDelay


def circuit_flows(circuit: Circuit) -> tuple[FlowAdd, FlowAdd]:
    """The two flows of a circuit, one per direction."""
    return (FlowAdd(circuit.port_a, circuit.port_b), FlowAdd(circuit.port_b, circuit.port_a))


def setup_operations(mode: str, circuits: Iterable[Circuit]) -> tuple[Operation, ...]:
    """What a freshly connected bridge of a rail in ``mode`` with ``circuits`` must do."""
    _require_mode(mode)
    flows = [f for c in sorted(circuits) for f in circuit_flows(c)]
    return (DeleteAllFlows(), TableMiss(normal=mode == "electrical"), *flows,
            Barrier(BarrierKind.SETUP))


def switch_operations(reconf: Reconfiguration, delay_ms: float) -> tuple[Operation, ...]:
    """Break-before-make for an accepted ``reconf``; nothing at all for an empty one."""
    if reconf.is_empty:
        return ()
    deletes = [FlowDelete(p) for c in sorted(reconf.remove) for p in c.ports]
    adds = [f for c in sorted(reconf.add) for f in circuit_flows(c)]
    return (*deletes, Barrier(BarrierKind.DARK), WaitDelay(delay_ms), *adds,
            Barrier(BarrierKind.LIGHT))


def _require_mode(mode: str, where: str = "") -> None:
    if mode not in ("ocs", "electrical"):
        raise ValueError(f"{where}rail mode must be 'ocs' or 'electrical', got {mode!r}")


class OcsRails:
    """Every rail of one emulated network: circuits, modes, delays; no timing, no switches.

    :meth:`accept` is the only way circuits change: it checks a whole batch against the state,
    commits it and returns each request's operations in the order they must run.
    """

    def __init__(self, rails: Sequence[RailDescription]) -> None:
        for r in rails:
            _require_mode(r.mode, f"rail {r.rail}: ")
        self.rails = {r.rail: r for r in rails}
        self.delay_ms = {r.rail: r.switching_delay_ms for r in rails}
        self.state = CrossconnectState({r.rail: r.ports for r in rails if r.mode == "ocs"})

    def describe(self) -> list[RailDescription]:
        return [RailDescription(r.rail, r.ports, self.delay_ms[r.rail], r.mode)
                for r in self.rails.values()]

    def set_delay_ms(self, rail: int, delay_ms: float) -> None:
        """Change a rail's switching delay (for requests accepted from now on)."""
        self.require_rail(rail)
        if not math.isfinite(delay_ms) or delay_ms < 0:
            raise ValueError(f"rail {rail}: switching delay must be a finite number >= 0 ms, "
                             f"got {delay_ms}")
        self.delay_ms[rail] = float(delay_ms)

    def circuits(self, rail: int) -> frozenset[Circuit]:
        self.require_ocs(rail)
        return self.state.circuits(rail)

    def port_states(self, rail: int, dark: Container[int] = ()) -> dict[int, PortState]:
        """Light of every port; an electrical rail's ports are always lit."""
        self.require_rail(rail)
        desc = self.rails[rail]
        if desc.mode == "electrical":
            return dict.fromkeys(desc.ports, PortState.LIT)
        return self.state.port_states(rail, dark=dark)

    def setup(self, rail: int) -> tuple[Operation, ...]:
        """The operations for a bridge of ``rail`` that has just connected."""
        self.require_rail(rail)
        mode = self.rails[rail].mode
        circuits: Collection[Circuit] = self.state.circuits(rail) if mode == "ocs" else ()
        return setup_operations(mode, circuits)

    def accept(self, reconfs: Sequence[Reconfiguration]) -> list[tuple[Operation, ...]]:
        """Check the batch (all-or-nothing), commit it, return each request's operations.

        Raises :class:`ReconfigurationRejected` naming the rail and ports; nothing changes then.
        """
        for r in reconfs:
            self.require_ocs(r.rail)
        self.state.check_all(reconfs)
        out = []
        for r in reconfs:
            self.state.apply(r)
            out.append(switch_operations(r, self.delay_ms[r.rail]))
        return out

    def require_rail(self, rail: int) -> None:
        if rail not in self.rails:
            raise ReconfigurationRejected(rail, [], f"no such rail (rails: {sorted(self.rails)})")

    def require_ocs(self, rail: int) -> None:
        self.require_rail(rail)
        if self.rails[rail].mode != "ocs":
            raise ReconfigurationRejected(
                rail, [], "rail is an electrical packet switch (baseline): it has no circuits")
