"""The rail-state switching model: how :class:`controller.calls.CallBook` serves a job under
``CoreConfig.semantics`` ``rail-state``, the public artifact's bitmask per rail.

:mod:`controller.railstate` states the model's rules and holds its pure bit state
(:class:`~controller.railstate.RailStateModel`); this module ties it to the call book: a
gathered call is served by the bit model, each request's bits switch as one decision on their
shadow rails, and a call is acked when its own and its joined switches have lit. One job per
controller (one bit state per rail). Predictions come from the plan (:meth:`CallBook.predict`),
not from completions, and a real ask does not withdraw them.

With ``CoreConfig.rail_state_serialize_per_rank`` the controller reads each rank's requests one
at a time, as the artifact's does (:class:`RankSockets`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from controller.instances import CallState, Instance, JobEntry
from controller.job import JobError, JobSpec
from controller.messages import Decision, Intent
from controller.ocs import ApplyResult, Circuit, Reconfiguration
from controller.output import Output
from controller.railstate import (
    RAIL_STATE,
    SHADOW_PORTS,
    Bit,
    BitOp,
    RailStateModel,
    bit_op_of,
    flip_reconf,
    job_shape,
    shadow_rail_id,
)
from controller.switching import BookView, end_events, undo

_NOTHING_WAITS: Mapping[Instance, None] = {}  # (rail-state queues requests in its bit model)


@dataclass(eq=False, slots=True)
class RailStateJob:
    """A rail-state job: its bit model, its groups' bit operations, its calls that switch."""

    job_id: str
    model: RailStateModel
    ops: dict[str, dict[int, BitOp]]  # group -> rail -> what serving its call does
    shadow: dict[Bit, int]  # (data rail, bit) -> the shadow rail that switches it
    calls: dict[int, Instance] = field(default_factory=dict)  # request id -> its call
    inflight: dict[int, tuple[int, tuple[Reconfiguration, ...]]] = field(
        default_factory=dict)  # decision id -> (request id, its flips)
    next_request: int = 1


class RankSockets:
    """Per-rank serialisation of requests (``CoreConfig.rail_state_serialize_per_rank``).

    The artifact's controller (``src/opus-controller/controller.cpp``) serves each rank's
    socket on its own thread, one line at a time; the request whose arrival completes a
    call's gathering is handled on that thread through the whole switch (the rail worker's
    reply), and the acks go out before the thread reads the socket again. So that rank's next
    requests are not read until the call it completed is answered. Here: the rank whose real or
    speculative ask makes a call switch is *busy* until the call settles (acked or failed);
    its requests meanwhile are held, in order, and handed back to the book then, as if they
    arrived at that time. A call acked at once blocks nothing, as the artifact answers a
    request that changes no bit without waiting.
    """

    def __init__(self, view: BookView) -> None:
        self._counters = view.counters
        self._intent = view.intent
        self._predict = view.predict
        self._busy: dict[tuple[str, int], int] = {}  # (job, rank) -> request it waits on
        self._held: dict[tuple[str, int], deque[tuple[bool, Intent, object]]] = {}
        self.asker: tuple[str, int] | None = None  # whose request the book is serving

    def hold(self, intent: Intent, ref: object, now: float, out: Output, real: bool) -> bool:
        """(controller.switching.RequestGate) hold ``intent`` while its rank is busy."""
        key = (intent.job_id, intent.rank)
        if key in self._busy:
            self._held.setdefault(key, deque()).append((real, intent, ref))
            self._counters["rail_state_held_requests"] += 1
            out.emit({"event": "request_held", "t_s": now, "job": intent.job_id,
                     "rank": intent.rank, "group": intent.group_id,
                     "seq": intent.seq, "speculative": not real,
                     "behind_request": self._busy[key]})
            return True
        self.asker = key
        return False

    def block(self, request_id: int) -> None:
        """The request being served switches: its asker's socket waits for its answer."""
        if self.asker is not None:
            self._busy[self.asker] = request_id
            self.asker = None

    def answered(self, request_id: int, now: float, out: Output) -> None:
        """A request was answered: read its asker's held requests until one blocks again."""
        for key in [k for k, rid in self._busy.items() if rid == request_id]:
            del self._busy[key]
            held = self._held.get(key)
            while held and key not in self._busy:
                real, intent, ref = held.popleft()
                out.extend(self._intent(intent, now, ref) if real else self._predict(intent, now))
            if not held:
                self._held.pop(key, None)

    def clear(self) -> None:
        self._busy.clear()
        self._held.clear()
        self.asker = None


class RailStateSwitching:
    """The rail-state switching model (see the module docstring; the interface is
    :class:`controller.switching.SwitchingModel`)."""

    #: (controller.switching.SwitchingModel) see the module docstring
    withdraws_predictions = False
    predicts_on_completion = False
    counts_late_predictions = True
    waiting = _NOTHING_WAITS

    def __init__(self, view: BookView) -> None:
        self.config = view.config
        self.state = view.state
        self.rails = view.rails
        self.optical = view.optical
        self.counters = view.counters
        self._jobs = view.jobs
        self._ack = view.ack
        self._reject = view.reject
        self._drop = view.drop
        self._lost_while_switching = view.lost_while_switching
        self.job: RailStateJob | None = None  # the rail-state job (one per core)
        self._next_decision = 1
        self.counters.update({"acked_at_once": 0, "bit_flips": 0, "stale_reflips": 0,
                              "rail_state_joined_bits": 0, "rail_state_early_bits": 0,
                              "late_predictions": 0})
        self.sockets = RankSockets(view) if self.config.rail_state_serialize_per_rank else None
        #: (controller.switching.SwitchingModel) the sockets hold a busy rank's requests
        self.gate = self.sockets
        if self.sockets is not None:
            self.counters["rail_state_held_requests"] = 0

    # ------------------------------------------------------------------ jobs

    def prepare_job(self, job: JobSpec) -> Callable[[JobEntry, float, Output], None]:
        """The job's bit model, taken in once the book registered the job."""
        rs = self._new_job(job)

        def added(_jb: JobEntry, _now: float, _out: Output) -> None:
            self.job = rs

        return added

    def job_removed(self, job: JobEntry) -> None:
        if self.job is not None and self.job.job_id == job.spec.job_id:
            self.job = None  # its switches in flight end as unknown decisions
            if self.sockets is not None:
                self.sockets.clear()

    def _new_job(self, job: JobSpec) -> RailStateJob:
        """The bit model of a job, or :class:`JobError` naming what the model cannot hold."""
        if self._jobs:
            raise JobError(f"job {job.job_id}: rail-state keeps one bit state per rail, so one "
                           f"job per controller (job {next(iter(self._jobs))} is registered)")
        n_rails, n_bits = job_shape(job)
        assert job.stages is not None  # job_shape checked
        shadow: dict[Bit, int] = {}
        for rail in range(n_rails):
            for bit in range(n_bits):
                sid = shadow_rail_id(rail, bit, n_rails, n_bits)
                desc = self.rails.get(sid)
                if desc is None or desc.mode != "ocs" or tuple(desc.ports) != SHADOW_PORTS:
                    raise JobError(f"job {job.job_id}: rail-state switches bit {bit} of rail "
                                   f"{rail} on shadow rail {sid} (an OCS with ports "
                                   f"{list(SHADOW_PORTS)}), which the OCS does not have")
                shadow[(rail, bit)] = sid
        data_ocs = sorted({rp.rail for rp in job.ranks.values()} & self.optical)
        if data_ocs:
            raise JobError(f"job {job.job_id}: rail-state carries the data on packet-switched "
                           f"(electrical) rails and switches only shadow rails, but rails "
                           f"{data_ocs} of its ranks are OCS rails")
        ops: dict[str, dict[int, BitOp]] = {}
        for gid, grp in job.groups.items():
            rails = list(job.demand[gid])
            if rails:
                op = bit_op_of(grp, job.stages)
                ops[gid] = dict.fromkeys(rails, op)
        model = RailStateModel(range(n_rails), self.config.rail_state_inflight)
        return RailStateJob(job.job_id, model, ops, shadow)

    # ------------------------------------------------------------- serving

    def asked(self, inst: Instance, now: float, out: Output) -> None:
        """Serve the call once every member asked (really or speculatively)."""
        if inst.asked < inst.group.n_members:
            return
        rs = self.job
        assert rs is not None  # (a call of a registered job: the book checked)
        grp = inst.group
        rid = rs.next_request
        rs.next_request += 1
        served = rs.model.serve(rid, rs.ops.get(grp.group_id, {}))
        self.counters["stale_reflips"] += served.stale_bits - served.joined_bits
        self.counters["rail_state_joined_bits"] += served.joined_bits
        self.counters["rail_state_early_bits"] += served.early_bits
        out.emit({
            "event": "rail_state_served", "t_s": now, "job": grp.job_id, "group": grp.group_id,
            "seq": inst.seq, "speculative": not inst.real,
            "requested": {str(r): m for r, m in served.requested.items()},
            "completed": {str(r): m for r, m in served.completed.items()},
            "bits": sorted([r, b] for r, b in served.request.bits) if served.request else [],
            "stale_bits": served.stale_bits, "joined_bits": served.joined_bits,
            "early_bits": served.early_bits})
        if served.request is None:
            inst.state = CallState.ACTIVE
            self.counters["acked_at_once"] += 1
            self._ack(inst, out, now, False)
            return
        inst.state = CallState.SWITCHING
        rs.calls[rid] = inst
        if self.sockets is not None:
            self.sockets.block(rid)
        for started in served.start:
            self._start(rs, started, now, out)

    def _start(self, rs: RailStateJob, rid: int, now: float, out: Output) -> None:
        """Switch a request's bits, each on its shadow rail, as one decision."""
        inst = rs.calls[rid]
        req = rs.model.request(rid)
        reconfs = []
        for bit in sorted(req.bits):
            sid = rs.shadow[bit]
            rc = flip_reconf(sid, self.state.circuits(sid))
            self.state.apply(rc)
            reconfs.append(rc)
        spec = not inst.real
        did = self._decide(rs, inst.group.group_id, inst.seq, tuple(reconfs), spec, now, out,
                           {"bits": sorted([r, b] for r, b in req.bits),
                            "target": {str(r): m for r, m in req.target.items()},
                            "waited_s": now - inst.t_first_s})
        rs.inflight[did] = (rid, tuple(reconfs))
        inst.decision_id = did
        self.counters["decisions"] += 1
        self.counters["reconfigurations"] += len(reconfs)
        self.counters["bit_flips"] += len(reconfs)
        if spec:
            self.counters["speculative_decisions"] += 1

    def _decide(self, rs: RailStateJob, group_id: str, seq: int,
                reconfs: tuple[Reconfiguration, ...], speculative: bool, now: float,
                out: Output, fields: dict[str, object]) -> int:
        did = self._next_decision
        self._next_decision += 1
        out.decisions.append(Decision(did, rs.job_id, group_id, seq, reconfs, speculative))
        out.emit({"event": "decision", "t_s": now, "decision": did, "job": rs.job_id,
                 "group": group_id, "seq": seq, "speculative": speculative,
                 "rails": [rc.rail for rc in reconfs], "semantics": RAIL_STATE,
                 **fields})
        for rc in reconfs:
            out.emit({"event": "reconfig_start", "t_s": now, "decision": did,
                     "rail": rc.rail, "ports": sorted(rc.touched_ports),
                     "add": [c.to_json() for c in sorted(rc.add)],
                     "remove": [c.to_json() for c in sorted(rc.remove)]})
        return did

    def _settle(self, rs: RailStateJob, now: float, out: Output, error: str
                ) -> list[tuple[int, bool]]:
        """Ack the calls whose own and joined switches have all lit; fail the others; returns
        the requests settled."""
        settled = rs.model.settled()
        for rid, ok in settled:
            inst = rs.calls.pop(rid)
            grp = inst.group
            if not ok:
                for _rank, ref in inst.real.items():
                    self._reject(out, now, ref, "reconfig_failed",
                                 f"switching for group {grp.group_id} failed: "
                                 f"{error or 'a switch it joined failed'}")
                self._drop(inst)
                continue
            if grp.instances.get(inst.seq) is inst and not self._lost_while_switching(inst, now,
                                                                                      out):
                inst.state = CallState.ACTIVE
                if inst.real:
                    self._ack(inst, out, now, True)
                else:
                    out.emit({"event": "provisioned", "t_s": now, "job": grp.job_id,
                             "group": grp.group_id, "seq": inst.seq})
        return settled

    def _answered(self, settled: list[tuple[int, bool]], now: float, out: Output) -> None:
        """(per-rank serialisation) read the held requests of the settled requests' askers."""
        if self.sockets is not None:
            for rid, _ok in settled:
                self.sockets.answered(rid, now, out)

    # ------------------------------------------------------- driver feedback

    def done(self, decision_id: int, results: Sequence[ApplyResult], now: float) -> Output:
        """A request's bits lit: ack its call's real askers, start the requests behind it."""
        out = Output()
        rs = self.job
        if rs is None or decision_id not in rs.inflight:
            return out  # (a decision of a job unregistered since, or unknown)
        rid, _reconfs = rs.inflight.pop(decision_id)
        end_events(decision_id, results, now, out)
        started = rs.model.finished(rid)
        settled = self._settle(rs, now, out, "")
        for rid_next in started:
            self._start(rs, rid_next, now, out)
        self._answered(settled, now, out)
        return out

    def failed(self, decision_id: int, error: str, now: float, out: Output,
               withdrawn: bool) -> None:
        """A rail-state decision failed: undo its flips, fail its call, free its bits."""
        rs = self.job
        if rs is None or decision_id not in rs.inflight:
            return
        rid, reconfs = rs.inflight.pop(decision_id)
        event: dict[str, object] = {"event": "reconfig_failed", "t_s": now,
                                    "decision": decision_id, "error": error}
        if withdrawn:
            event["withdrawn"] = True
        out.emit(event)
        for rc in reconfs:
            undo(self.state, self.state.apply, decision_id, rc, now, out)
        started = rs.model.finished(rid, lit=False)
        settled = self._settle(rs, now, out, error)
        for rid_next in started:
            self._start(rs, rid_next, now, out)
        self._answered(settled, now, out)

    def commit(self, rc: Reconfiguration) -> None:
        """Take a change of the switch into the crossconnect state (the only index here)."""
        self.state.apply(rc)

    # (controller.switching.SwitchingModel) nothing is protected, dark to the data plane or
    # queued here: the bit model orders the requests, and only acknowledgements wait

    def released(self, inst: Instance, now: float) -> None:
        pass

    def withdraw(self, inst: Instance) -> None:
        pass

    def turned_real(self, inst: Instance) -> None:
        pass

    def pump(self, now: float, out: Output) -> None:
        pass

    def active_circuits(self) -> frozenset[Circuit]:
        return frozenset()

    def dark_ports(self) -> frozenset[tuple[int, int]]:
        return frozenset()
