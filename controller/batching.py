"""Decisions that queue behind a rail's switch go to the OCS together once it has lit.

An OCS rail takes one request at a time: the service and the simulation wait for a request's
light before they send the next on that rail. Decisions made while a rail switches used to
queue one behind the other, each paying the whole switching delay, so a rail of many ranks
whose groups change phase at different moments spent most of an iteration switching (a
1024-GPU Llama3.1-405B iteration: 460 decisions of 25 ms, one after the other, per rail).

:class:`RailBatcher` (pure: no clock, no I/O) keeps the rails that are switching and the
decisions waiting. When a rail lights, the decisions waiting for it leave together: one
request per rail, the sequential composition of their reconfigurations in the order the core
made them (a decision planned on ports that an earlier one frees still finds them free). A
decision on several rails leaves once all are free; a rail stays blocked behind a waiting
decision, so a rail's decisions never pass each other. Batches that share no rail are
separate requests (they light on their own rails' delays). A real OCS takes such a batch as
one request (a Polatis NETCONF edit-config with several cross-connects); a request the switch
refuses fails every decision in it.

A refused request also fails the decisions waiting behind it that touch one of its ports (and,
in turn, those behind them that touch theirs): the core planned them on the circuits the refused
request would have made, which the switch never made (:meth:`RailBatcher.failed`). Sending them
anyway would ask the switch for changes to circuits it does not have; the core undoes them all,
newest first, and plans again on what the switch really holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controller.core import Decision
from controller.ocs import ApplyResult, Circuit, Reconfiguration


def compose(rail: int, reconfs: Sequence[Reconfiguration]) -> Reconfiguration:
    """One request on ``rail`` with the effect of applying ``reconfs`` in order."""
    add: set[Circuit] = set()
    remove: set[Circuit] = set()
    for rc in reconfs:
        for c in rc.remove:
            if c in add:
                add.discard(c)  # added earlier in the batch, removed now: never lit
            else:
                remove.add(c)
        for c in rc.add:
            if c in remove:
                remove.discard(c)  # removed earlier in the batch and put back: untouched
            else:
                add.add(c)
    return Reconfiguration(rail, frozenset(add), frozenset(remove))


@dataclass(frozen=True)
class Batch:
    """Decisions that go to the driver as one ``apply_many`` (one request per rail)."""

    batch_id: int
    decisions: tuple[Decision, ...]
    reconfs: tuple[Reconfiguration, ...]

    @property
    def rails(self) -> frozenset[int]:
        return frozenset(rc.rail for rc in self.reconfs)

    def split(self, results: Sequence[ApplyResult]) -> dict[int, list[ApplyResult]]:
        """Decision id -> its own results: its circuits, with its rails' batch timestamps."""
        by_rail = {r.rail: r for r in results}
        out: dict[int, list[ApplyResult]] = {}
        for dec in self.decisions:
            out[dec.decision_id] = [
                ApplyResult(rc.rail, rc.add, rc.remove, res.t_request_s, res.t_dark_s,
                            res.t_light_s)
                for rc in dec.reconfs if (res := by_rail.get(rc.rail)) is not None]
        return out


class RailBatcher:
    """Which decisions start now, and together; see the module docstring."""

    def __init__(self) -> None:
        self._switching: set[int] = set()
        self._waiting: list[Decision] = []
        self._in_flight: dict[int, Batch] = {}
        self._next_id = 1

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, decision: Decision) -> list[Batch]:
        """A new decision from the core; returns the batches to start now."""
        self._waiting.append(decision)
        return self._start()

    def finished(self, batch_id: int) -> tuple[Batch, list[Batch]]:
        """A batch lit; returns it and the batches to start now."""
        batch = self._in_flight.pop(batch_id)
        self._switching -= batch.rails
        return batch, self._start()

    def failed(self, batch_id: int) -> tuple[Batch, list[Decision], list[Batch]]:
        """A batch failed (the switch changed nothing); returns it, the waiting decisions that
        fail with it (in the order the core made them) and the batches to start now.

        A waiting decision fails with it when it touches a port (rail, port) that the batch or
        an earlier failing decision touches: its plan rests on their circuits. Waiting decisions
        on other ports stay valid whatever happens to the batch, and go on.
        """
        batch = self._in_flight.pop(batch_id)
        self._switching -= batch.rails
        tainted = {(rc.rail, p) for dec in batch.decisions for rc in dec.reconfs
                   for p in rc.touched_ports}
        behind: list[Decision] = []
        still: list[Decision] = []
        for dec in self._waiting:
            ports = {(rc.rail, p) for rc in dec.reconfs for p in rc.touched_ports}
            if ports & tainted:
                tainted |= ports
                behind.append(dec)
            else:
                still.append(dec)
        self._waiting = still
        return batch, behind, self._start()

    def _start(self) -> list[Batch]:
        blocked = set(self._switching)
        going: list[tuple[set[int], list[Decision]]] = []  # rails, decisions in order
        still: list[Decision] = []
        for dec in self._waiting:
            rails = {rc.rail for rc in dec.reconfs}
            if rails & blocked:
                blocked |= rails  # later decisions on these rails stay behind this one
                still.append(dec)
                continue
            joined = [g for g in going if g[0] & rails]
            merged_rails, merged = set(rails), []
            for g in joined:
                going.remove(g)
                merged_rails |= g[0]
                merged += g[1]
            merged.append(dec)
            going.append((merged_rails, merged))
        self._waiting = still
        batches = []
        for rails, decisions in going:
            decisions.sort(key=lambda d: d.decision_id)
            reconfs = tuple(
                compose(rail, [rc for d in decisions for rc in d.reconfs if rc.rail == rail])
                for rail in sorted(rails))
            batch = Batch(self._next_id, tuple(decisions), reconfs)
            self._next_id += 1
            self._in_flight[batch.batch_id] = batch
            self._switching |= rails
            batches.append(batch)
        return batches
