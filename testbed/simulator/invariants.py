"""The physical invariants of a simulated run, checked on every event that could break them.

:class:`~testbed.simulator.engine.PlanSimulation` calls :class:`CircuitInvariants` on each
request it sends to the OCS driver, each ack and each completion the core sees; a broken
invariant raises :class:`InvariantViolation` naming the time, the rail, the ports and the call,
and the run fails. The checks are independent of the core's own bookkeeping:

* **no active circuit is ever cut**: a call is acknowledged only when every circuit of its
  demand is lit at that moment (on the driver), and from then until its last member completes
  no request the engine sends (a :class:`~controller.batching.Batch`: the composed request per
  rail) touches a port of those circuits. Only a request changes or darkens a circuit, so a
  group's circuits found lit stay lit until a request touches a port of its members: its check
  is redone only then;
* **one-to-one**: every request keeps each port of each rail in at most one circuit, checked
  against the circuits already sent by :class:`~controller.ocs.CrossconnectState` (the one
  implementation of the rule); routing follows these circuits (:attr:`circuits`);
* **FCFS per rail**: requests reach each rail in the order the core made their decisions
  (decision ids increase per rail), as :class:`~controller.batching.RailBatcher` promises.

Each check costs what the event changes: the ports of a request (and the groups on them); at a
call's first ack, its demand if a request touched its members' ports; a counter per member.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.batching import Batch
from controller.core import Ack
from controller.drivers.sim import SimOcsDriver
from controller.job import JobSpec
from controller.ocs import CrossconnectState, Reconfiguration, ReconfigurationRejected

Port = tuple[int, int]  # (rail, port)
CallKey = tuple[str, int]  # (group, seq)


class InvariantViolation(RuntimeError):
    """A physical invariant broke; the message names the time, rail, ports and call."""


class _ActiveCall:
    """An acknowledged call: the ports of the circuits it uses, and members not done yet."""

    __slots__ = ("open", "ports")

    def __init__(self, ports: frozenset[Port]) -> None:
        self.ports = ports
        self.open = 0


class CircuitInvariants:
    """Checks one job's run on one simulated OCS (see the module docstring)."""

    def __init__(self, job: JobSpec, driver: SimOcsDriver) -> None:
        self.driver = driver
        #: the circuits of every request sent (committed once the driver accepted it)
        self.circuits = CrossconnectState({d.rail: d.ports for d in driver.describe()})
        self._optical = frozenset(d.rail for d in driver.describe() if d.mode == "ocs")
        self._peers = {rail: self.circuits.peers(rail) for rail in self.circuits.rails}
        self._last_decision: dict[int, int] = {}  # rail -> id of the last decision sent
        # only a request changes a port's circuit or light: a group's check holds until one
        # touches a port of its members, which drops it (see rebind)
        #: bumped whenever :meth:`route` may answer otherwise (a request applied, a new job)
        self.routes_epoch = 0
        self.rebind(job)

    def rebind(self, job: JobSpec) -> None:
        """Check ``job`` from now on (a failover registered the job again, its failed rank on a
        spare's ports); the calls before were abandoned, so none is active any more."""
        self.job = job
        self.routes_epoch += 1
        self._ports = {r: rp.ports for r, rp in job.ranks.items()}
        # (rail, port) -> (its rank, its index among the rank's ports)
        self._owner = {(rp.rail, p): (r, i) for r, rp in job.ranks.items()
                       for i, p in enumerate(rp.ports)}
        self._active: dict[CallKey, _ActiveCall] = {}
        self._checked: dict[str, frozenset[Port]] = {}  # group -> its circuits' ports
        self._groups_at: dict[Port, list[str]] = {}  # port -> groups with a member on it
        self._indexed: set[str] = set()  # groups in _groups_at
        self._users: dict[Port, int] = {}  # port -> active calls using its circuit

    # ----------------------------------------------------------------- requests

    def request(self, batch: Batch, now: float) -> None:
        """``batch`` is about to go to the driver: FCFS, no active circuit cut, one-to-one."""
        last = self._last_decision
        for dec in batch.decisions:
            for rc in dec.reconfs:
                before = last.get(rc.rail, -1)
                if dec.decision_id <= before:
                    raise InvariantViolation(
                        f"t={now:.6f} s: rail {rc.rail} got decision {dec.decision_id} "
                        f"({dec.group_id}#{dec.seq}) after decision {before}: the core made "
                        "them in the other order (FCFS per rail)")
                last[rc.rail] = dec.decision_id
        for rc in batch.reconfs:
            if self._users:
                self._check_untouched(rc, batch, now)
            try:
                self.circuits.check(rc)
            except ReconfigurationRejected as exc:
                raise InvariantViolation(
                    f"t={now:.6f} s: a request for {_decisions(batch)} breaks the one-to-one "
                    f"rule: {exc}") from exc

    def applied(self, reconfs: Sequence[Reconfiguration]) -> None:
        """The driver accepted ``reconfs``: routing follows their circuits from now on, and the
        checks of the groups with a member on a touched port must be redone."""
        self.routes_epoch += 1
        checked = self._checked
        groups_at = self._groups_at
        for rc in reconfs:
            self.circuits.apply(rc)
            for p in rc.touched_ports:
                for group_id in groups_at.get((rc.rail, p), ()):
                    checked.pop(group_id, None)

    def _check_untouched(self, rc: Reconfiguration, batch: Batch, now: float) -> None:
        users = self._users
        rail = rc.rail
        for p in rc.touched_ports:
            if (rail, p) in users:
                calls = sorted(f"{g}#{s}" for (g, s), call in self._active.items()
                               if (rail, p) in call.ports)
                raise InvariantViolation(
                    f"t={now:.6f} s: a request for {_decisions(batch)} on rail {rail} touches "
                    f"port {p} (circuit {p}<->{self.circuits.peer(rail, p)}), which call(s) "
                    f"{', '.join(calls)} use: acknowledged and not completed")

    # -------------------------------------------------------------------- calls

    def acked(self, acks: Sequence[Ack], now: float) -> None:
        """The core acknowledged ``acks`` now: each call's circuits must be lit, and stay
        untouched until every acknowledged member completed."""
        if not self._optical:
            return
        active = self._active
        for ack in acks:
            key = (ack.group_id, ack.seq)
            call = active.get(key)
            if call is None:
                call = active[key] = _ActiveCall(self._checked_ports(ack, now))
                users = self._users
                for port in call.ports:
                    users[port] = users.get(port, 0) + 1
            call.open += 1

    def completed(self, group_id: str, seq: int) -> None:
        """A member's completion is about to reach the core."""
        key = (group_id, seq)
        call = self._active.get(key)
        if call is None:
            return  # not acknowledged: the core refuses the completion
        call.open -= 1
        if call.open:
            return
        del self._active[key]
        users = self._users
        for port in call.ports:
            n = users[port] - 1
            if n:
                users[port] = n
            else:
                del users[port]

    def _checked_ports(self, ack: Ack, now: float) -> frozenset[Port]:
        """:meth:`_lit_ports` of the call, or the group's last result if no request touched a
        port of its members since (:meth:`applied` drops it then)."""
        group_id = ack.group_id
        ports = self._checked.get(group_id)
        if ports is not None:
            return ports
        if group_id not in self._indexed:
            self._indexed.add(group_id)
            job = self.job
            for port in {(rail, p) for rail in job.demand[group_id] if rail in self._optical
                         for r in job.groups[group_id].ranks if job.ranks[r].rail == rail
                         for p in job.ranks[r].ports}:
                self._groups_at.setdefault(port, []).append(group_id)
        ports = self._checked[group_id] = self._lit_ports(ack, now)
        return ports

    def _lit_ports(self, ack: Ack, now: float) -> frozenset[Port]:
        """The ports of the circuits the call's transfers take; each must be lit now."""
        ports: set[Port] = set()
        lit_peer = self.driver.lit_peer
        group_id, seq, rank = ack.group_id, ack.seq, ack.rank
        for rail, edges in self.job.demand[group_id].items():
            if rail not in self._optical:
                continue
            ports_of = self._ports
            for a, b in edges:
                for src, dst in ((a, b), (b, a)):  # as the engine routes each direction
                    route = self.route(rail, src, dst)
                    if route is None:
                        raise InvariantViolation(
                            f"t={now:.6f} s: rank {rank} was acknowledged for call "
                            f"{group_id}#{seq} but ranks {src} and {dst} have no circuit on "
                            f"rail {rail}")
                    p, q = ports_of[src][route[0]], ports_of[dst][route[1]]
                    if (rail, p) in ports:
                        continue  # both directions take one circuit: checked already
                    if lit_peer(rail, p, now) != q:
                        raise InvariantViolation(
                            f"t={now:.6f} s: rank {rank} was acknowledged for call "
                            f"{group_id}#{seq} but its circuit {p}<->{q} on rail {rail} "
                            f"(ranks {src}, {dst}) is dark")
                    ports.add((rail, p))
                    ports.add((rail, q))
        return frozenset(ports)

    def route(self, rail: int, src: int, dst: int) -> tuple[int, int] | None:
        """Which ports a transfer ``src`` -> ``dst`` takes, as indices into each rank's ports:
        the first of ``src``'s ports whose circuit reaches ``dst``; None if none does."""
        peers = self._peers[rail]
        owner = self._owner
        for i, p in enumerate(self._ports[src]):
            q = peers.get(p)
            if q is not None:
                o = owner.get((rail, q))
                if o is not None and o[0] == dst:
                    return i, o[1]
        return None


def _decisions(batch: Batch) -> str:
    return "decision(s) " + ", ".join(f"{d.decision_id} ({d.group_id}#{d.seq})"
                                      for d in batch.decisions)
