"""static-once: a toy switching model, the worked example of docs/switching-models.md.

When a job registers, it lights every circuit that the job's groups need, as one decision, and
never switches again: a call is acked once all its members asked and that decision lit. A job
that needs more circuits at a rank than the rank has ports is refused. A test model, not a
product feature: a static rival plane would choose its circuits with a real algorithm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from controller.instances import CallState, Instance, JobEntry
from controller.job import JobError, JobSpec
from controller.messages import Decision
from controller.ocs import ApplyResult, Circuit, Reconfiguration
from controller.output import Output
from controller.switching import BookView, end_events, undo


class StaticOnce:
    """One decision per job, at registration; every call rides on its circuits."""

    withdraws_predictions = False  # (no speculation: the circuits are there before any call)
    predicts_on_completion = False
    counts_late_predictions = False
    gate = None  # no request waits for another at the controller

    def __init__(self, view: BookView) -> None:
        self.view = view
        self.waiting: dict[Instance, None] = {}  # gathered calls waiting for their job's light
        self.circuits: dict[str, frozenset[Circuit]] = {}  # job -> its circuits
        self.lit: set[str] = set()  # jobs whose decision lit
        self.broken: dict[str, str] = {}  # job -> why its decision failed
        self.inflight: dict[int, tuple[str, tuple[Reconfiguration, ...]]] = {}
        self.next_decision = 1

    # ------------------------------------------------------------------ jobs

    def prepare_job(self, job: JobSpec) -> Callable[[JobEntry, float, Output], None]:
        """Give every rank pair of every group a circuit, a port of each rank each, or refuse."""
        free = {r: list(rp.ports) for r, rp in job.ranks.items()}
        want: set[Circuit] = set()
        for rail in sorted(self.view.optical):
            pairs = {e for gid in job.groups for e in job.demand[gid].get(rail, ())}
            for a, b in sorted(pairs):
                for r in (a, b):
                    if not free[r]:
                        raise JobError(f"job {job.job_id}: static-once needs all its circuits "
                                       f"at once; rank {r} has no port left on rail {rail} "
                                       f"for its pair ({a}, {b})")
                want.add(Circuit(rail, free[a].pop(0), free[b].pop(0)))

        def added(jb: JobEntry, now: float, out: Output) -> None:
            self.circuits[job.job_id] = frozenset(want)
            self._dispatch(job.job_id, now, out)

        return added

    def _dispatch(self, job_id: str, now: float, out: Output) -> None:
        """Switch the job's circuits in, as one decision (none if they are lit already)."""
        state, want = self.view.state, self.circuits[job_id]
        reconfs = []
        for rail in sorted({c.rail for c in want}):
            mine = {c for c in want if c.rail == rail}
            ports = {p for c in mine for p in c.ports}
            gone = {c for c in state.circuits(rail) - mine if ports & set(c.ports)}
            rc = Reconfiguration(rail, add=frozenset(mine - state.circuits(rail)),
                                 remove=frozenset(gone))
            if not rc.is_empty:
                state.apply(rc)  # rule 3: the state follows decisions as dispatched
                reconfs.append(rc)
        if not reconfs:
            self.lit.add(job_id)
            return
        did, self.next_decision = self.next_decision, self.next_decision + 1
        self.inflight[did] = (job_id, tuple(reconfs))
        out.decisions.append(Decision(did, job_id, "", -1, tuple(reconfs), False))
        self.view.counters["decisions"] += 1
        self.view.counters["reconfigurations"] += len(reconfs)
        out.emit({"event": "decision", "t_s": now, "decision": did, "job": job_id,
                  "group": "", "seq": -1, "speculative": False,
                  "rails": [rc.rail for rc in reconfs], "semantics": "static-once"})
        for rc in reconfs:
            out.emit({"event": "reconfig_start", "t_s": now, "decision": did, "rail": rc.rail,
                      "ports": sorted(rc.touched_ports),
                      "add": [c.to_json() for c in sorted(rc.add)],
                      "remove": [c.to_json() for c in sorted(rc.remove)]})

    def job_removed(self, job: JobEntry) -> None:
        job_id = job.spec.job_id
        for inst in [i for i in self.waiting if i.group.job_id == job_id]:
            self.withdraw(inst)
        self.circuits.pop(job_id, None)
        self.lit.discard(job_id)
        self.broken.pop(job_id, None)

    # ------------------------------------------------------------- serving

    def asked(self, inst: Instance, now: float, out: Output) -> None:
        """Once every member really asked: ack on lit circuits, else wait for the light."""
        if len(inst.real) < inst.group.n_members:
            return  # (speculative asks never make a call go here)
        job_id = inst.group.job_id
        if job_id in self.broken:
            for ref in inst.real.values():
                self.view.reject(out, now, ref, "reconfig_failed",
                                 f"static-once: the circuits of job {job_id} failed: "
                                 f"{self.broken[job_id]}")
            self.view.drop(inst)
        elif job_id in self.lit:
            inst.state = CallState.ACTIVE
            self.view.ack(inst, out, now, False)
        else:
            inst.state = CallState.QUEUED
            inst.in_queue = True
            self.waiting[inst] = None

    def pump(self, now: float, out: Output) -> None:
        for inst in [i for i in self.waiting if i.group.job_id in self.lit]:
            self.withdraw(inst)
            inst.state = CallState.ACTIVE
            self.view.ack(inst, out, now, True)

    def withdraw(self, inst: Instance) -> None:
        self.waiting.pop(inst, None)
        inst.in_queue = False

    def released(self, inst: Instance, now: float) -> None:
        pass  # the circuits stay: they are never changed

    def turned_real(self, inst: Instance) -> None:
        pass  # (only calls every member really asked for wait here)

    # ------------------------------------------------------- driver feedback

    def done(self, decision_id: int, results: Sequence[ApplyResult], now: float) -> Output:
        out = Output()
        entry = self.inflight.pop(decision_id, None)
        if entry is None:
            return out  # rule 5: unknown, or of a job unregistered since
        end_events(decision_id, results, now, out)
        if entry[0] in self.circuits:
            self.lit.add(entry[0])
            self.pump(now, out)
        return out

    def failed(self, decision_id: int, error: str, now: float, out: Output,
               withdrawn: bool) -> None:
        entry = self.inflight.pop(decision_id, None)
        if entry is None:
            return
        job_id, reconfs = entry
        out.emit({"event": "reconfig_failed", "t_s": now, "decision": decision_id,
                  "error": error})
        for rc in reconfs:
            undo(self.view.state, self.view.state.apply, decision_id, rc, now, out)
        if job_id in self.circuits:
            self.broken[job_id] = error
            for inst in [i for i in self.waiting if i.group.job_id == job_id]:
                self.withdraw(inst)
                inst.state = CallState.GATHER
                self.asked(inst, now, out)  # rejects its askers now that the job is broken

    def commit(self, rc: Reconfiguration) -> None:
        self.view.state.apply(rc)

    # ---------------------------------------------------------------- views

    def active_circuits(self) -> frozenset[Circuit]:
        return frozenset(c for job_id in self.lit for c in self.circuits[job_id])

    def dark_ports(self) -> frozenset[tuple[int, int]]:
        return frozenset((rc.rail, p) for _job, reconfs in self.inflight.values()
                         for rc in reconfs for p in rc.touched_ports)
