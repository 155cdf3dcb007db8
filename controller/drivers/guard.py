"""A run touches only its own ports: :class:`PortGuard`, around any hardware :class:`OcsDriver`.

On a switch that several users share, a run owns the ports its ``ocs:`` mapping lists
(``ports:``, per rail; every port of the switch if it lists none). Every driver the registry
makes (:func:`controller.drivers.registry.make_driver`) comes wrapped in a guard, so a new
vendor's driver gets these rules by construction:

* **before the first edit** the guard reads the switch (:meth:`OcsDriver.switch_connections`:
  every cross-connect on it, other users' too) and refuses to start (:class:`PortConflict`) if
  a cross-connect that is not the run's uses one of the run's ports. A cross-connect is the
  run's when both its ends are the run's ports: one with an end outside them belongs to
  someone else (or joins the run to someone else), and the run must not cut it;
* **a batch** that names a port outside the run's ports is refused
  (:class:`~controller.ocs.ReconfigurationRejected`) before anything is sent;
* **teardown** (:meth:`PortGuard.restore`, and :meth:`PortGuard.close` when made with
  ``restore_on_close``) puts back the circuits the run found on its ports, and nothing else:
  it removes the circuits the run made and re-makes the ones it found, among its own ports
  only. A port another user's cross-connect has taken meanwhile is left alone and reported.

What the guard found is :attr:`PortGuard.found` (circuits among the run's ports) and
:attr:`PortGuard.conflicts` (cross-connects that join a run's port to another port).
One-way cross-connects among the run's ports are the run's, but an :class:`OcsDriver` makes
duplex circuits only, so teardown does not re-make them (:attr:`PortGuard.one_way_found`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controller import ocs

log = logging.getLogger(__name__)


class PortConflict(RuntimeError):
    """Another user's cross-connect uses one of the run's ports; nothing was sent."""


@dataclass(frozen=True)
class Restored:
    """What :meth:`PortGuard.restore` did on one rail; ``left`` are circuits it could not put
    back (or remove) because another user's cross-connect now uses their ports."""

    rail: int
    added: frozenset[ocs.Circuit]
    removed: frozenset[ocs.Circuit]
    left: frozenset[ocs.Circuit]

    def to_json(self) -> dict[str, object]:
        return {"rail": self.rail, "added": [c.to_json() for c in sorted(self.added)],
                "removed": [c.to_json() for c in sorted(self.removed)],
                "left": [c.to_json() for c in sorted(self.left)]}


def port_text(ports: Iterable[int]) -> str:
    """``1-4,9``: sorted ports with runs folded."""
    out: list[str] = []
    run: list[int] = []
    for p in sorted(set(ports)):
        if run and p == run[-1] + 1:
            run.append(p)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [p]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def conflicts_of(connections: Iterable[tuple[int, int]], owned: frozenset[int]
                 ) -> list[tuple[int, int]]:
    """The connections with one end among ``owned`` and one outside: (owned end, other end)."""
    out = set()
    for a, b in connections:
        if (a in owned) != (b in owned):
            out.add((a, b) if a in owned else (b, a))
    return sorted(out)


class PortGuard(ocs.OcsDriver):
    """``inner`` restricted to the run's ports (``owned`` per rail; default: the ports
    ``inner.describe()`` gives, i.e. the ``ocs:`` mapping's ``ports``).

    ``claim``: refuse to start on a conflict (:meth:`claim`); a read-only user (``ocs
    status``) passes False and may still read, but no edit is sent while a conflict stands.
    """

    def __init__(self, inner: ocs.OcsDriver, owned: Mapping[int, Iterable[int]] | None = None,
                 *, claim: bool = True, restore_on_close: bool = False) -> None:
        self.inner = inner
        self.restore_on_close = restore_on_close
        self._descs = {d.rail: d for d in inner.describe()}
        self.owned: dict[int, frozenset[int]] = {
            rail: frozenset(owned[rail] if owned is not None and rail in owned else d.ports)
            for rail, d in self._descs.items()}
        self.found: dict[int, frozenset[ocs.Circuit]] = {}
        self.one_way_found: dict[int, frozenset[tuple[int, int]]] = {}
        self.conflicts: dict[int, list[tuple[int, int]]] = {}
        self.read_switch()
        if claim:
            self.claim()

    # --- the rules ---------------------------------------------------------------------------

    def read_switch(self) -> None:
        """Read every rail's switch: what the run finds on its ports, and conflicts."""
        for rail, d in self._descs.items():
            if d.mode != "ocs":
                self.found[rail] = frozenset()
                continue
            owned = self.owned[rail]
            connections = self.inner.switch_connections(rail)
            circuits = frozenset(c for c in self.inner.circuits(rail)
                                 if c.port_a in owned and c.port_b in owned)
            self.found[rail] = circuits
            full = {c.ports for c in circuits}
            self.one_way_found[rail] = frozenset(
                (a, b) for a, b in connections if a in owned and b in owned
                and tuple(sorted((a, b))) not in full)
            self.conflicts[rail] = conflicts_of(connections, owned)

    def claim(self) -> None:
        """Raise :class:`PortConflict` naming every cross-connect of another user found on
        the run's ports."""
        lines = []
        for rail, pairs in sorted(self.conflicts.items()):
            for mine, other in pairs:
                lines.append(f"rail {rail}: port {mine} is cross-connected to port {other}, "
                             "which is not this run's")
        if lines:
            rails = "; ".join(f"rail {r}: {port_text(self.owned[r])}"
                              for r in sorted(self.conflicts) if self.conflicts[r])
            raise PortConflict(
                "refusing to start: " + "; ".join(lines) + f" (the run's ports: {rails}). "
                "Another user's circuit? Free those ports, or leave them out of ocs.ports; "
                "nothing was sent to the switch")

    def check(self, reconfs: Sequence[ocs.Reconfiguration]) -> None:
        """Refuse (``ReconfigurationRejected``) a batch naming a port outside the run's, or any
        edit while another user's cross-connect holds one of the run's ports."""
        for r in reconfs:
            owned = self.owned.get(r.rail)
            if owned is None:
                raise ocs.ReconfigurationRejected(r.rail, [], f"no such rail in this run "
                                                  f"(rails: {sorted(self.owned)})")
            outside = r.touched_ports - owned
            if outside:
                raise ocs.ReconfigurationRejected(
                    r.rail, sorted(outside), f"not among this run's ports ({port_text(owned)}: "
                    "ocs.ports); refused before anything was sent")
            if self.conflicts.get(r.rail):
                raise ocs.ReconfigurationRejected(
                    r.rail, [p for p, _ in self.conflicts[r.rail]], "another user's "
                    "cross-connect uses this run's port(s); no edit is sent while it does")

    def restore(self) -> list[Restored]:
        """Put back what the run found on its ports (only there); returns what was done."""
        out = []
        reconfs = []
        for rail, d in self._descs.items():
            if d.mode != "ocs":
                continue
            owned = self.owned[rail]
            taken = {p for p, _ in conflicts_of(self.inner.switch_connections(rail), owned)}
            now = frozenset(c for c in self.inner.circuits(rail)
                            if c.port_a in owned and c.port_b in owned)
            add, remove = self.found[rail] - now, now - self.found[rail]
            left = frozenset(c for c in add | remove if taken & set(c.ports))
            # a circuit to re-make whose port a run's circuit still holds goes with it
            add, remove = add - left, remove - left
            blocked = {p for c in left for p in c.ports}
            left |= frozenset(c for c in add if blocked & set(c.ports) and c not in left)
            add = frozenset(c for c in add if c not in left)
            if left:
                log.warning("rail %d: circuits %s not restored: another user's cross-connect "
                            "now uses their ports", rail, sorted(str(c) for c in left))
            if add or remove:
                reconfs.append(ocs.Reconfiguration(rail, add=add, remove=remove))
            out.append(Restored(rail, add, remove, left))
        if reconfs:
            self.inner.apply_many(reconfs)
        return out

    # --- OcsDriver ---------------------------------------------------------------------------

    def describe(self) -> list[ocs.RailDescription]:
        return [ocs.RailDescription(d.rail, tuple(p for p in d.ports if p in self.owned[d.rail]),
                                    d.switching_delay_ms, d.mode)
                for d in self._descs.values()]

    def circuits(self, rail: int) -> frozenset[ocs.Circuit]:
        return self.inner.circuits(rail)

    def port_states(self, rail: int) -> dict[int, ocs.PortState]:
        return self.inner.port_states(rail)

    def switch_connections(self, rail: int) -> frozenset[tuple[int, int]]:
        return self.inner.switch_connections(rail)

    def apply_many(self, reconfs: Sequence[ocs.Reconfiguration]) -> list[ocs.ApplyResult]:
        reconfs = list(reconfs)
        self.check(reconfs)
        return self.inner.apply_many(reconfs)

    def close(self) -> None:
        """Restore (``restore_on_close``) and close the vendor driver, whatever happens."""
        try:
            if self.restore_on_close and not any(self.conflicts.values()):
                self.restore()
        finally:
            self.inner.close()

    def __enter__(self) -> PortGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        """Close; while an exception unwinds, a failed restore is logged, not raised over it."""
        if not exc or exc[0] is None:
            self.close()
            return
        try:
            self.close()
        except Exception:
            log.exception("teardown could not restore the run's ports")

    def __getattr__(self, name: str) -> object:
        """The vendor driver's own extras (``device_info``, ``read_device``, ...: reads for
        the lab CLI) pass through; edits go through :meth:`apply_many` only."""
        if name.startswith("_") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
