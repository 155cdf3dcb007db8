r"""The calls of the Opus core: instances, gathering, acks and completions, lost ranks and
speculation. Shared by every switching model.

A collective call of a comm group is an *instance* ``(job, group, seq)``; ``seq`` counts the
group's calls at each rank, so all members name the same call with the same number. As in the
paper, an instance is served once all its members have asked; with provisioning, speculative asks
count too, so the switch can start before the real intents arrive. The ack goes to every member
once all have really asked and the circuits are lit; until then no member can move data, so early
members lose nothing by waiting, and a call holds (protects) circuits only while it can actually
run, which keeps valid programs free of controller-induced deadlock. Life cycle::

    GATHER --all members asked--> QUEUED --plan fits--> SWITCHING --light--> ACTIVE --all done-->
       \-- all asked really and circuits already lit ---------------------> ACTIVE

:class:`CallBook` keeps the jobs and their calls and hands a call to the switching model
(:mod:`controller.switching` states the contract) whenever it got an ask while gathering;
serving, switching and provisioning are the model's. The model gets a
:class:`~controller.switching.BookView` (values and the book's actions, bound) in its
constructor; the book calls the model's hooks through bound methods it keeps as its own
attributes (``_asked``, ``_released``, ...), so a hook costs what a method of the book would:
the hot paths (one intent, one completion) pay no extra lookup for the split.

The records live in :mod:`controller.instances` and :class:`Output` in :mod:`controller.output`;
their names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from controller.instances import CallState, Group, Instance, JobEntry
from controller.job import JobError, JobSpec
from controller.messages import Ack, CoreConfig, Event, Intent, Reject
from controller.ocs import CrossconnectState, RailDescription
from controller.output import LazyEvent, Output
from controller.switching import BookView, ModelFactory, RequestGate, SwitchingModel

__all__ = ["CallBook", "CallState", "Group", "Instance", "JobEntry", "LazyEvent", "Output"]

# Builders of the lazily recorded events (see LazyEvent): each turns its record into the dict
# the core used to build on the spot, with the same keys in the same order.

def _ev_intent(r: LazyEvent, into: list[Event]) -> None:
    _, t_s, job, rank, group, seq, kind, size_bytes, axis = r
    into.append({"event": "intent", "t_s": t_s, "job": job, "rank": rank, "group": group,
                 "seq": seq, "kind": kind, "size_bytes": size_bytes, "axis": axis})


def _ev_complete(r: LazyEvent, into: list[Event]) -> None:
    _, t_s, job, rank, group, seq = r
    into.append({"event": "complete", "t_s": t_s, "job": job, "rank": rank, "group": group,
                 "seq": seq})


def _ev_acks(r: LazyEvent, into: list[Event]) -> None:
    """One ``ack`` event per rank of ``ranks``, in that order."""
    _, t_s, job, ranks, group, seq, reconfigured, wait_s = r
    for rank in ranks:
        into.append({"event": "ack", "t_s": t_s, "job": job, "rank": rank, "group": group,
                     "seq": seq, "reconfigured": reconfigured, "wait_s": wait_s})


def _ev_done(r: LazyEvent, into: list[Event]) -> None:
    _, t_s, job, group, seq = r
    into.append({"event": "collective_done", "t_s": t_s, "job": job, "group": group,
                 "seq": seq})


_ACTIVE, _GATHER = CallState.ACTIVE, CallState.GATHER  # (module constants: read per intent)


class CallBook:
    """The jobs and their calls, for one set of rails; the switching model does the rest.

    ``model`` makes the switching model from the book's :class:`BookView`; the book binds the
    model's hooks (see the module docstring for why they are bound, not looked up).
    :class:`controller.core.OpusCore` is the book with its model chosen by name.
    """

    def __init__(self, rails: Sequence[RailDescription], config: CoreConfig | None,
                 model: ModelFactory) -> None:
        self.config = config or CoreConfig()
        self.rails = {r.rail: r for r in rails}
        self.optical = {r.rail for r in rails if r.mode == "ocs"}
        self.state = CrossconnectState({r.rail: r.ports for r in rails})
        self._owner: dict[tuple[int, int], tuple[str, int]] = {}  # (rail, port) -> (job, rank)
        self._jobs: dict[str, JobEntry] = {}
        # (job, rank) -> the calls it asked for speculatively, in the order it asked
        self._spec_of: dict[tuple[str, int], dict[Instance, None]] = {}
        self.counters: dict[str, int] = {
            "intents": 0, "acks": 0, "decisions": 0, "reconfigurations": 0,
            "avoided_reconfigurations": 0, "speculative_decisions": 0, "mispredictions": 0,
            "rejects": 0,
        }
        self._use(model(self._view()))

    def _view(self) -> BookView:
        """What the switching model gets: values, our tables as read-only mappings (typed so:
        a proxy would cost a lookup more on the planner's paths) and our actions, bound."""
        return BookView(
            config=self.config, rails=self.rails, optical=frozenset(self.optical),
            state=self.state, counters=self.counters, jobs=self._jobs, owners=self._owner,
            ack=self._ack, finish=self._finish, reject=self._reject, drop=self._drop,
            lost_while_switching=self._lost_while_switching, intent=self.intent,
            predict=self.predict)

    def _use(self, model: SwitchingModel) -> None:
        """Serve calls with ``model``: keep its hooks as bound methods of our own."""
        self._model = model
        self._waiting: Mapping[Instance, None] = model.waiting
        self._asked: Callable[[Instance, float, Output], None] = model.asked
        self._released: Callable[[Instance, float], None] = model.released
        self._withdraw: Callable[[Instance], None] = model.withdraw
        self._turned_real: Callable[[Instance], None] = model.turned_real
        self._pump: Callable[[float, Output], None] = model.pump
        self._withdraws_predictions = model.withdraws_predictions
        self._gate: RequestGate | None = model.gate
        self._completion_predicts = self.config.provisioning and model.predicts_on_completion

    # ------------------------------------------------------------------ jobs

    def register_job(self, job: JobSpec, now: float, ref: object = None) -> Output:
        """Add a job; a clash with the rails or another job's ports is rejected, nothing changes."""
        out = Output()
        try:
            self._check_job(job)
            added = self._model.prepare_job(job)
        except JobError as exc:
            return self._reject(out, now, ref, "bad_job", str(exc), job=job.job_id)
        groups = {}
        for gid, grp in job.groups.items():
            demand = {rail: edges for rail, edges in job.demand[gid].items()
                      if rail in self.optical}
            groups[gid] = Group(job.job_id, gid, grp.axis, frozenset(grp.ranks), demand)
        self._jobs[job.job_id] = jb = JobEntry(job, groups)
        for rank_ports in job.ranks.values():
            for p in rank_ports.ports:
                self._owner[(rank_ports.rail, p)] = (job.job_id, rank_ports.rank)
        out.emit({"event": "job_registered", "t_s": now, "job": job.job_id,
                  "ranks": len(job.ranks), "groups": len(job.groups)})
        added(jb, now, out)
        return out

    def _check_job(self, job: JobSpec) -> None:
        if job.job_id in self._jobs:
            raise JobError(f"job {job.job_id} is already registered")
        for rp in job.ranks.values():
            if rp.rail not in self.rails:
                raise JobError(f"job {job.job_id}: rank {rp.rank} is on rail {rp.rail}, "
                               f"which the OCS does not have (rails: {sorted(self.rails)})")
            known = self.state.ports(rp.rail)
            bad = [p for p in rp.ports if p not in known]
            if bad:
                raise JobError(f"job {job.job_id}: rank {rp.rank} names ports {bad} that rail "
                               f"{rp.rail} does not have")
            for p in rp.ports:
                other = self._owner.get((rp.rail, p))
                if other is not None:
                    raise JobError(f"job {job.job_id}: rank {rp.rank} claims rail {rp.rail} port "
                                   f"{p}, owned by job {other[0]} rank {other[1]}")

    def unregister_job(self, job_id: str, now: float) -> Output:
        """Drop a job: its waiting ranks get an error; its circuits stay as they are.

        A decision of the job still in flight ends as an ``orphaned_decision``: the
        crossconnect state follows the driver's outcome, the dead job's calls are not served.
        """
        out = Output()
        job = self._jobs.pop(job_id, None)
        if job is None:
            return self._reject(out, now, None, "unknown_job", f"no job {job_id!r}")
        for grp in job.groups.values():
            grp.alive = False
            for inst in grp.instances.values():
                for rank, ref in inst.real.items():
                    if rank not in inst.acked:
                        self._reject(out, now, ref, "job_unregistered",
                                     f"job {job_id} was unregistered")
                if inst.state is CallState.ACTIVE:
                    self._released(inst, now)
        for key in [k for k, v in self._owner.items() if v[0] == job_id]:
            del self._owner[key]
        self._model.job_removed(job)
        for spec_key in [k for k in self._spec_of if k[0] == job_id]:
            del self._spec_of[spec_key]
        out.emit({"event": "job_unregistered", "t_s": now, "job": job_id})
        self._pump(now, out)
        return out

    def job(self, job_id: str) -> JobSpec | None:
        j = self._jobs.get(job_id)
        return j.spec if j else None

    # --------------------------------------------------------------- intents

    def intent(self, intent: Intent, now: float, ref: object = None) -> Output:
        """A rank asks for the circuits of one call; ack now, later, or reject (or, with the
        model's :class:`RequestGate`, hold it until the rank's earlier request is answered)."""
        out = Output()
        if self._gate is not None and self._gate.hold(intent, ref, now, out, True):
            return out
        self.counters["intents"] += 1
        job_id, rank, group_id, seq = intent.job_id, intent.rank, intent.group_id, intent.seq
        job = self._jobs.get(job_id)
        grp = job.groups.get(group_id) if job is not None else None
        # (a member is a rank of the job: JobSpec checks it)
        if (job is None or grp is None or rank not in grp.members
                or seq <= grp.done_seq.get(rank, -1)):
            self._lookup(intent, out, now, ref)  # rejects, naming the first failed check
            return out
        if job.lost and not job.lost.isdisjoint(grp.members):
            lost = min(job.lost & grp.members)
            return self._reject(out, now, ref, "peer_lost",
                                f"rank {lost} of group {group_id} disconnected",
                                job=job_id, rank=rank, group=group_id, seq=seq)
        kind, size_bytes, axis = intent.kind, intent.size_bytes, intent.axis
        out.emit((_ev_intent, now, job_id, rank, group_id, seq, kind, size_bytes,
                  axis))
        inst = grp.instances.get(seq)
        if inst is not None and rank in inst.real:
            return self._reject(out, now, ref, "duplicate",
                                f"rank {rank} already asked for group {grp.group_id} call {seq}")
        if self._spec_of and self._withdraws_predictions:
            self._cancel_speculation(job.spec.job_id, rank, grp, seq, now, out)
        if inst is None:
            # _new_instance written out: one call fewer per intent (the most frequent input)
            inst = grp.instances[seq] = Instance(grp, seq, now)
        inst.kind, inst.size_bytes, inst.axis = kind, size_bytes, axis
        spec = inst.spec
        if spec:
            spec.discard(rank)
        real = inst.real
        turns_real = not real and inst.in_queue
        real[rank] = ref
        if turns_real:
            self._turned_real(inst)
        state = inst.state
        if state is _ACTIVE:
            self._ack(inst, out, now)
        elif state is _GATHER and len(real) + len(spec) >= grp.n_members:
            self._asked(inst, now, out)  # (it does nothing until everyone asked)
        return out

    def complete(self, job_id: str, rank: int, group_id: str, seq: int, now: float,
                 ref: object = None, next_intent: Intent | None = None) -> Output:
        """A rank finished its part of a call; ``next_intent`` is its predicted next call."""
        out = Output()
        job = self._jobs.get(job_id)
        grp = job.groups.get(group_id) if job is not None else None
        inst = grp.instances.get(seq) if grp is not None else None
        if job is None or grp is None or inst is None or rank not in inst.acked:
            return self._reject(out, now, ref, "bad_completion",
                                f"job {job_id} rank {rank}: no acknowledged call {seq} of group "
                                f"{group_id} to complete")
        completed = inst.completed
        if rank in completed:
            return self._reject(out, now, ref, "duplicate",
                                f"rank {rank} already completed group {group_id} call {seq}")
        completed.add(rank)
        done_seq = grp.done_seq
        if seq > done_seq.get(rank, -1):
            done_seq[rank] = seq
        out.emit((_ev_complete, now, job_id, rank, group_id, seq))
        if len(completed) >= grp.n_members:
            self._finish(inst, now, out)
        if next_intent is not None and self._completion_predicts:
            self._speculate(next_intent, now, out, ref)
        if self._waiting:
            self._pump(now, out)
        return out

    def rank_lost(self, job_id: str, rank: int, now: float) -> Output:
        """A rank's shim is gone: release its running calls and fail the calls waiting on it.

        The job remembers the rank: later calls of its groups are rejected (``peer_lost``) and
        a call of one being switched is failed when the switch ends, until the rank greets
        again (:meth:`rank_rejoined`) or the job is unregistered (which forgets everything).
        """
        out = Output()
        job = self._jobs.get(job_id)
        if job is None or rank not in job.spec.ranks:
            return out
        out.emit({"event": "rank_lost", "t_s": now, "job": job_id, "rank": rank})
        job.lost.add(rank)  # later calls of its groups are rejected too (intent)
        for grp in job.groups.values():
            if rank not in grp.members:
                continue
            for inst in list(grp.instances.values()):
                if inst.state is CallState.ACTIVE:
                    inst.completed.add(rank)
                    if len(inst.completed) >= len(grp.members):
                        self._finish(inst, now, out)
                elif inst.state in (CallState.GATHER, CallState.QUEUED):
                    for r, ref in inst.real.items():
                        if r != rank:
                            self._reject(out, now, ref, "peer_lost",
                                         f"rank {rank} of group {grp.group_id} disconnected")
                    self._drop(inst)
                else:  # SWITCHING: finishes, then reconfig_done fails the survivors
                    inst.real.pop(rank, None)
                    inst.spec.discard(rank)
        self._spec_of.pop((job_id, rank), None)
        self._pump(now, out)
        return out

    def rank_rejoined(self, job_id: str, rank: int, now: float) -> Output:
        """A rank lost before greets the controller again: its groups are served again.

        The service calls this whenever it opens a session for the rank (a shim's hello,
        heartbeat or request after it was declared lost); for a rank that is not marked lost
        it does nothing.
        """
        out = Output()
        job = self._jobs.get(job_id)
        if job is None or rank not in job.lost:
            return out
        job.lost.discard(rank)
        out.emit({"event": "rank_rejoined", "t_s": now, "job": job_id, "rank": rank})
        return out

    def _lost_while_switching(self, inst: Instance, now: float, out: Output) -> bool:
        """A member of the call was lost while its circuits switched: fail the others' asks
        and drop the call (True), or nothing (False)."""
        grp = inst.group
        lost = self._jobs[grp.job_id].lost
        if not lost or lost.isdisjoint(grp.members):
            return False
        for _rank, ref in inst.real.items():
            self._reject(out, now, ref, "peer_lost",
                         f"rank {min(lost & grp.members)} of group {grp.group_id} disconnected")
        self._drop(inst)
        return True

    # ------------------------------------------------------------ internals

    def _lookup(self, intent: Intent, out: Output, now: float,
                ref: object) -> tuple[JobEntry, Group] | None:
        job = self._jobs.get(intent.job_id)
        if job is None:
            self._reject(out, now, ref, "unknown_job", f"no job {intent.job_id!r} is registered")
            return None
        if intent.rank not in job.spec.ranks:
            self._reject(out, now, ref, "unknown_rank",
                         f"job {intent.job_id} has no rank {intent.rank}")
            return None
        grp = job.groups.get(intent.group_id)
        if grp is None:
            self._reject(out, now, ref, "unknown_group",
                         f"job {intent.job_id} has no comm group {intent.group_id!r}")
            return None
        if intent.rank not in grp.members:
            self._reject(out, now, ref, "not_a_member",
                         f"rank {intent.rank} is not in group {intent.group_id}")
            return None
        if intent.seq <= grp.done_seq.get(intent.rank, -1):
            self._reject(out, now, ref, "stale_seq",
                         f"rank {intent.rank} already completed call {intent.seq} of group "
                         f"{intent.group_id}")
            return None
        return job, grp

    def _new_instance(self, grp: Group, seq: int, now: float) -> Instance:
        inst = Instance(grp, seq, now)
        grp.instances[seq] = inst
        return inst

    def _reject(self, out: Output, now: float, ref: object, code: str, message: str,
                **fields: object) -> Output:
        self.counters["rejects"] += 1
        out.rejects.append(Reject(ref, code, message))
        out.emit({"event": "error", "t_s": now, "code": code, "message": message,
                 **fields})
        return out

    def _ack(self, inst: Instance, out: Output, now: float, reconfigured: bool = False) -> None:
        grp = inst.group
        job_id, group_id, seq = grp.job_id, grp.group_id, inst.seq
        acked = inst.acked
        real = inst.real
        if not acked:  # (the usual case: the call goes, every asker is acked at once)
            ranks = list(real)
            acked.update(ranks)
            new_acks = [Ack(ref, job_id, rank, group_id, seq, reconfigured)
                        for rank, ref in real.items()]
            out.take_acks(new_acks)
        else:
            acks = out.acks
            ranks = []
            for rank, ref in real.items():
                if rank in acked:
                    continue
                acked.add(rank)
                ranks.append(rank)
                acks.append(Ack(ref, job_id, rank, group_id, seq, reconfigured))
        if ranks:
            self.counters["acks"] += len(ranks)
            out.emit((_ev_acks, now, job_id, ranks, group_id, seq, reconfigured,
                      now - inst.t_first_s))

    def _finish(self, inst: Instance, now: float, out: Output) -> None:
        self._released(inst, now)
        self._drop(inst)
        out.emit((_ev_done, now, inst.group.job_id, inst.group.group_id, inst.seq))

    def _drop(self, inst: Instance) -> None:
        grp = inst.group
        instances = grp.instances
        if instances.get(inst.seq) is inst:
            del instances[inst.seq]
        if inst.in_queue:
            self._withdraw(inst)
        for rank in inst.spec:
            s = self._spec_of.get((grp.job_id, rank))
            if s is not None:
                s.pop(inst, None)

    # ---------------------------------------------------------- speculation

    def _speculate(self, nxt: Intent, now: float, out: Output, ref: object) -> None:
        job = self._jobs.get(nxt.job_id)
        grp = job.groups.get(nxt.group_id) if job else None
        if job is None or grp is None or nxt.rank not in grp.members or (
            nxt.seq <= grp.done_seq.get(nxt.rank, -1)
        ):
            out.emit({"event": "error", "t_s": now, "code": "bad_prediction",
                     "message": f"ignored prediction {nxt.to_json()}"})
            return
        if job.lost and not job.lost.isdisjoint(grp.members):
            out.emit({"event": "error", "t_s": now, "code": "peer_lost",
                     "message": f"ignored prediction {nxt.to_json()}: rank "
                                f"{min(job.lost & grp.members)} of group "
                                f"{grp.group_id} disconnected"})
            return
        inst = grp.instances.get(nxt.seq)
        if inst is None:
            inst = self._new_instance(grp, nxt.seq, now)
            inst.kind, inst.size_bytes, inst.axis = nxt.kind, nxt.size_bytes, nxt.axis
        if nxt.rank in inst.real or inst.state is CallState.ACTIVE:
            return
        inst.spec.add(nxt.rank)
        self._spec_of.setdefault((nxt.job_id, nxt.rank), {})[inst] = None
        out.emit({"event": "speculative_intent", "t_s": now, "job": nxt.job_id,
                 "rank": nxt.rank, "group": nxt.group_id, "seq": nxt.seq,
                 "kind": nxt.kind, "size_bytes": nxt.size_bytes})
        if inst.state is CallState.GATHER:
            self._asked(inst, now, out)

    def _cancel_speculation(self, job_id: str, rank: int, grp: Group, seq: int, now: float,
                            out: Output) -> None:
        insts = self._spec_of.get((job_id, rank))
        if not insts:
            return
        for inst in list(insts):
            insts.pop(inst, None)
            if inst.group is grp and inst.seq == seq:
                continue
            inst.spec.discard(rank)
            self.counters["mispredictions"] += 1
            out.emit({"event": "mispredict", "t_s": now, "job": job_id, "rank": rank,
                     "predicted_group": inst.group.group_id, "predicted_seq": inst.seq,
                     "actual_group": grp.group_id, "actual_seq": seq})
            if inst.state is CallState.QUEUED and not inst.ready:
                self._withdraw(inst)
                inst.state = CallState.GATHER
            if inst.state is CallState.GATHER and not inst.real and not inst.spec:
                self._drop(inst)

    # ------------------------------------------------------------- planning

    def predict(self, intent: Intent, now: float) -> Output:
        """A rank names its next call ahead of time (provisioning under rail-state, from the
        plan): a speculative ask. Ignored, with an event, when provisioning is off; where the
        model counts late predictions, one of a call the rank asked for or finished already is
        counted and dropped."""
        out = Output()
        if self._gate is not None and self._gate.hold(intent, None, now, out, False):
            return out
        if not self.config.provisioning:
            out.emit({"event": "prediction_ignored", "t_s": now,
                     "reason": "provisioning is off", **intent.to_json()})
            return out
        job = self._jobs.get(intent.job_id)
        grp = job.groups.get(intent.group_id) if job is not None else None
        if self._model.counts_late_predictions and job is not None and grp is not None:
            inst = grp.instances.get(intent.seq)
            if (intent.seq <= grp.done_seq.get(intent.rank, -1)
                    or (inst is not None and intent.rank in inst.real)):
                self.counters["late_predictions"] += 1
                return out
        self._speculate(intent, now, out, None)
        return out

    # ---------------------------------------------------------------- views

    def pending(self) -> list[tuple[str, str, int, str]]:
        """(job, group, seq, state) of every call not finished yet, for diagnostics."""
        return [(g.job_id, g.group_id, i.seq, i.state.value)
                for j in self._jobs.values() for g in j.groups.values()
                for i in g.instances.values()]
