"""Faults and spare-GPU failover on the sim backend: the emulated runner's failover, on the
virtual clock.

:class:`FailoverSimulation` is a :class:`~testbed.simulator.engine.PlanSimulation` whose OCS has
the spares' ports too (dark until used) and :class:`~controller.drivers.faults.OcsFaults`, and
which carries out an experiment's ``faults`` as the emulated runner does:

* ``kill``, ``link_down``, ``hang`` (at an iteration: as the rank starts it; or at a time) and
  ``port_failed`` on a rank's port take that rank out. The simulation then *freezes* every rank:
  their pending work is dropped (the OCS's switches in flight still light). On the emulator the
  other ranks go on until they are told to abort and then throw that work away, so freezing them
  at once leaves the recovery's timing as it is; it only drops the doomed calls' records;
* after the detection time (:class:`FailoverCosts`: a process exit is seen within the runner's
  poll, a hung rank only when its heartbeats time out) the job is unregistered from the Opus
  core (its calls are abandoned: the invariant checker forgets them) and a spare on the rank's
  rail is chosen, as the runner chooses it (same server first);
* after the restart time the job is registered again as a new epoch in which the rank owns the
  spare's ports, and every rank resumes from the first iteration not all of them completed,
  with fresh call numbers; Opus rewires the circuits that touch the spare's ports on first use;
* ``--no-spares``: every rank restarts on healthy hosts after ``failover.migration_delay_s`` plus
  the emulator's measured restart of every rank process;
* ``jitter`` sets the driver's jitter; ``refuse`` makes the OCS refuse the next requests: the
  refused calls are asked for again (as the replayer does), up to three times.

Records carry ``epoch`` and the controller events the runner's steps (``fault``,
``failure_detected``, ``epoch_aborted``, ``spare_assigned``, ``ranks_resumed``, ...), so
:mod:`testbed.metrics.failover` measures both backends alike. The physical invariants are
checked throughout, across the failover.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.clock import VirtualClock
from controller.core import Output
from controller.drivers.faults import OcsFaults
from controller.drivers.sim import SimOcsDriver
from controller.job import JobSpec, RankPorts
from controller.protocol import may_retry
from testbed.experiment.config import ExperimentConfig
from testbed.experiment.faults import RANK_FAULTS, Fault
from testbed.failover import Host, epoch_job_id, resume_iteration, take_over
from testbed.plan.replay import PlanOp
from testbed.simulator.engine import PlanSimulation, Record, SimulationError
from testbed.simulator.state import Call, RankState


@dataclass(frozen=True)
class FailoverCosts:
    """The emulator's fixed failover costs, in seconds, as ``opus-testbed bench failover``
    measured them on the 2-core development machine at load 11-13 (docs/failover.md, "Measured")."""

    #: from a process's death to the runner seeing it (its poll is 20 ms; measured p50
    #: 0.013-0.025 s)
    detect_exit_s: float = 0.02
    #: after a heartbeat timeout, until the controller's check notices (it runs every 0.1 s and
    #: the last heartbeat came up to an interval, 0.5 s, before the failure)
    heartbeat_extra_s: float = 0.3
    #: detection -> every rank resumed on the spare (abort, unregister, the spare's identity,
    #: register, the ranks picking the control up; measured 0.04-0.09 s, the spare's first
    #: call reaching the controller up to 0.2 s later)
    restart_s: float = 0.12
    #: detection -> every rank process started again (``--no-spares``), besides the migration
    #: delay: a fixed part and one per rank (measured restart 2.3 s with 4 ranks, 5.2 s with 16)
    restart_all_s: float = 1.3
    restart_all_per_rank_s: float = 0.24


class FailoverSimulation(PlanSimulation):
    """A plan simulation with faults, spares and failover (see the module docstring)."""

    def __init__(self, programs: Mapping[int, Sequence[PlanOp]], job: JobSpec,
                 settings: ExperimentConfig, *, gpus_per_server: int,
                 costs: FailoverCosts | None = None, seed: int = 0,
                 jitter_ms: float = 0.0, **kwargs: Any) -> None:
        """``settings`` gives the mode, the switching delay, the faults, the spares (its
        ``shape``), ``--no-spares`` and the failover timings."""
        self.ocs_faults = OcsFaults(seed)
        spares = settings.shape.spares
        electrical = settings.mode == "baseline"
        ports = {rail: set(ps) for rail, ps in job.ports_by_rail.items()}
        for s in spares:
            ports.setdefault(s.rail, set()).update(s.ports)
        driver = SimOcsDriver({r: sorted(ps) for r, ps in ports.items()},
                              0.0 if electrical else settings.switching_delay,
                              clock=VirtualClock(),
                              jitter_ms=jitter_ms, seed=seed,
                              mode="electrical" if electrical else "ocs",
                              faults=self.ocs_faults)
        super().__init__(programs, job, settings, gpus_per_server=gpus_per_server, seed=seed,
                         driver=driver, **kwargs)
        self.programs = {r: list(ops) for r, ops in programs.items()}
        self.base_job = job.job_id
        self.faults = list(settings.faults)
        n = len(job.ranks)
        # every host that can carry a rank: (rail, ports, server); ranks first, then spares
        self.hosts = {r: (rp.rail, rp.ports, r // gpus_per_server) for r, rp in job.ranks.items()}
        self.hosts.update({n + s.index: (s.rail, s.ports, s.server) for s in spares})
        self.free = {n + s.index for s in spares}
        self.host_of = {r: r for r in job.ranks}  # rank -> the host carrying it
        self.repair_s = settings.failover.repair_s
        self.policy = "restart" if settings.no_spares else "spares"
        self.heartbeat_timeout_s = settings.failover.heartbeat_timeout_s
        self.migration_delay_s = settings.failover.migration_delay_s
        self.costs = costs or FailoverCosts()
        self.epoch = 0
        self.frozen = False
        self.fired: set[int] = set()
        self.broken: set[int] = set()  # hosts with a FAILED OCS port: never used again
        self._retries: dict[Call, int] = {}
        self.counters["retries"] = 0
        for f in self.faults:
            if f.at_s is not None:
                self._at(f.at_s, self._fault_due, f)

    # ------------------------------------------------------------- plumbing

    def _record(self, record: Record) -> None:
        record["epoch"] = self.epoch
        super()._record(record)

    def _event(self, name: str, **fields: Any) -> None:
        self.events.append({"event": name, "t_s": self.now, **fields})

    def _stale(self, ref: object) -> bool:
        """A call of an abandoned epoch (or of every rank, while frozen)."""
        return isinstance(ref, Call) and (self.frozen or self.ranks.get(ref.rank.rank)
                                           is not ref.rank)

    def _absorb(self, out: Output) -> None:
        retry: list[Call] = []
        rejects = []
        for rej in out.rejects:
            if self._stale(rej.ref):
                continue
            if isinstance(rej.ref, Call) and may_retry(rej.code, self._retries.get(rej.ref, 0)):
                retry.append(rej.ref)
                continue
            rejects.append(rej)
        acks = [a for a in out.acks if not self._stale(a.ref)]
        super()._absorb(Output(acks, rejects, out.decisions, out.events))
        for call in retry:
            self._retries[call] = self._retries.get(call, 0) + 1
            self.counters["retries"] += 1
            self._at(self.now + self._control_s(), self._intent, call)

    def _call_end(self, call: Call) -> None:
        first = len(self.records)
        retries = self._retries.pop(call, 0)
        super()._call_end(call)
        if retries:
            self.records[first]["retries"] = retries  # the call's record comes first

    # --------------------------------------------------------------- faults

    def _start_iteration(self, st: RankState) -> None:
        it = st.started + 1
        for f in self.faults:
            if f.index in self.fired or f.at_s is not None or (
                    f.at_iteration is None and f.kind in RANK_FAULTS):
                continue
            at = f.at_iteration or 0  # an OCS fault without a time: from the start
            if f.kind in RANK_FAULTS and f.rank == st.rank and at == it:
                self.fired.add(f.index)
                self._event("fault", kind=f.kind, rank=st.rank, index=f.index, it=it)
                self._fail(st.rank, "heartbeat" if f.kind == "hang" else "exit")
                return
            if f.kind not in RANK_FAULTS and at <= it:
                self._fault_due(f)
        super()._start_iteration(st)

    def _fault_due(self, f: Fault) -> None:
        if f.index in self.fired:
            return
        self.fired.add(f.index)
        info: dict[str, Any] = {"kind": f.kind, "index": f.index}
        if f.kind in RANK_FAULTS:
            assert f.rank is not None
            self._event("fault", rank=f.rank, **info)
            self._fail(f.rank, "heartbeat" if f.kind == "hang" else "exit")
        elif f.kind == "port_failed":
            assert f.rail is not None and f.port is not None
            self.ocs_faults.fail_port(f.rail, f.port)
            self._event("fault", rail=f.rail, port=f.port, **info)
            owner = next((r for r, rp in self.job.ranks.items()
                          if rp.rail == f.rail and f.port in rp.ports), None)
            for h, (rail, ports, _server) in self.hosts.items():
                if rail == f.rail and f.port in ports:
                    self.broken.add(h)
                    self.free.discard(h)
            if owner is not None:
                self._fail(owner, "exit")  # no light on its NIC: its watchdog ends it
        elif f.kind == "jitter":
            self.driver.jitter_ms = f.jitter_ms
            self._event("fault", jitter_ms=f.jitter_ms, **info)
        elif f.kind == "refuse":
            self.ocs_faults.refuse(f.count)
            self._event("fault", count=f.count, **info)

    # ------------------------------------------------------------- failover

    def _fail(self, rank: int, via: str) -> None:
        """``rank`` is out: freeze every rank; the detection comes after its delay."""
        if self.frozen:
            raise SimulationError(f"rank {rank} failed at t={self.now:.6f} s while the job was "
                                  "recovering from another failure; the simulation handles one "
                                  "at a time")
        self.frozen = True
        keep: set[Callable[..., Any]] = {self._lit, self._fault_due, self._detected,
                                         self._resumed, self._repaired}
        self._drop_events(keep)
        self.egress.clear()
        self.ingress.clear()
        self._open.clear()
        # sync-step rendezvous of the abandoned epoch: ranks resume at the same iteration
        # numbers, so a stale mark would skip a rendezvous and a held flow would count its
        # dead call's bytes towards the new one
        self._posted.clear()
        self._held.clear()
        t_heartbeat = self.now + self.heartbeat_timeout_s + self.costs.heartbeat_extra_s
        self.events.append({"event": "heartbeat_lost", "t_s": t_heartbeat,
                            "job": self.job.job_id, "rank": rank})
        detect_s = t_heartbeat - self.now if via == "heartbeat" else self.costs.detect_exit_s
        self._at(self.now + detect_s, self._detected, rank, via)

    def _completed(self) -> int:
        """The first iteration not every rank completed in this epoch."""
        return resume_iteration([self.iterations] + [
            next((it for it in range(st.first, self.iterations) if st.left[it]),
                 self.iterations) for st in self.ranks.values()])

    def _host(self, host: int) -> Host:
        rail, ports, server = self.hosts[host]
        return Host(host, rail, server, ports)

    def _detected(self, rank: int, via: str) -> None:
        host = self.host_of[rank]
        self._event("failure_detected", rank=rank, host=host, via=via, epoch=self.epoch)
        self._event("epoch_aborted", epoch=self.epoch, job=self.job.job_id)
        self._absorb(self.core.unregister_job(self.job.job_id, self.now))
        self.invariants.rebind(self.job)  # its calls are abandoned: none is active any more
        start = self._completed()
        ports = dict(self.job.ranks)
        delay_s = self.costs.restart_s
        if self.policy == "spares":
            rail = ports[rank].rail
            failed = Host(host, rail, self.hosts[host][2], ports[rank].ports)
            takeover = take_over(ports, rank, failed, (self._host(h) for h in self.free))
            if takeover is None:
                self._event("no_spare", rank=rank, rail=rail)
                raise SimulationError(f"rank {rank} failed at t={self.now:.6f} s and no spare "
                                      f"is left on rail {rail} to take it over")
            spare = takeover.spare.host
            self.free.discard(spare)
            self.host_of[rank] = spare
            if self.repair_s is not None and host not in self.broken:
                self._at(self.now + self.repair_s, self._repaired, host)
            self._event("spare_assigned", **takeover.event())
            ports = takeover.ports
        else:
            self.ocs_faults.failed.clear()  # the job moves to a healthy rack
            delay_s = (self.costs.restart_all_s + self.migration_delay_s
                       + self.costs.restart_all_per_rank_s * len(self.job.ranks))
            self._event("migration", delay_s=self.migration_delay_s, rank=rank)
        self._at(self.now + delay_s, self._resumed, rank, ports, start)

    def _repaired(self, host: int) -> None:
        """A failed host is back in the spare pool (``failover.repair_s``)."""
        self.free.add(host)
        self._event("host_repaired", host=host)

    def _resumed(self, rank: int, ports: dict[int, RankPorts], start: int) -> None:
        self.epoch += 1
        # the same job on the new ports: its stages and port check (none on electrical rails)
        # carry over, as the runner's plan.job does on the emulator
        job = dataclasses.replace(self.job, job_id=epoch_job_id(self.base_job, self.epoch),
                                  ranks=ports)
        self.job = job
        self.ports = {r: rp.ports for r, rp in job.ranks.items()}
        self.invariants.rebind(job)
        self._absorb(self.core.register_job(job, self.now))
        self._event("ranks_resumed", epoch=self.epoch, job=job.job_id, start_iteration=start,
                    rank=rank, host=self.host_of[rank], policy=self.policy)
        self.frozen = False
        self._finished = 0
        self.ranks = {r: RankState(r, self.programs[r], self.iterations, start)
                      for r in self.programs}
        for r in sorted(self.ranks):
            st = self.ranks[r]
            self._emit(r, ev="resumed", t=self.now, it=start)
            self._start_iteration(st)
