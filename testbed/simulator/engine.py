"""The sim backend's event engine: every rank's replay plan on a virtual clock.

The same schedule, the same plan (:mod:`testbed.plan.replay`) and the same Opus core run against the
simulated OCS driver (:class:`~controller.drivers.sim.SimOcsDriver`) and the analytic network of
:mod:`testbed.simulator.network`. Every rank executes its plan by the rules the replayer
(:mod:`testbed.emulated.replayer`) follows too, :mod:`testbed.plan.progress`: lanes, deps,
iterations that start when the previous one is done, predictions; then the shim's intent / ack /
completion with a per-rank :class:`~controller.profile.CallProfile` shared by the lanes, steps whose
receptions wait for the sender's transfer. Records and controller events come out in the emulated
run's formats, with times in seconds of the virtual clock (starting at 0). The run's objects (ranks,
lanes, calls, their connections and flows, ports) are in :mod:`testbed.simulator.state`.

Decisions go to :meth:`SimOcsDriver.begin`; their light comes back to the core as
``reconfig_done``. As in the controller service, decisions made while their rails switch wait
and then leave together, one request per rail (:class:`controller.batching.RailBatcher`).
Every request, ack and completion is checked against the physical invariants (no active
circuit cut, one-to-one, FCFS per rail: :mod:`testbed.simulator.invariants`); a violation fails
the run with a :class:`SimulationError` naming it.

Rail-state semantics (:mod:`controller.railstate`): the data rails are packet-switched, as the
baseline's, and the driver gets the shadow OCS rails on which the bits switch; a call whose plan
op is not ``gated`` runs without asking (no intent, ack or completion), and after a call with
``predict`` the rank names that call to the controller (provisioning from the plan; the profile
predicts nothing). With ``rail_state_ack_timeout_s`` a rank waits at most that long (from
sending its intent) for the ack, then runs the call without it, as the artifact's shim does; the
late ack is then dropped, and the call's completion goes to the controller once both the call
ended and the late ack came (the controller's call is still switching until then).

Symmetric ranks (``mirrors``, used by :mod:`testbed.simulator.bench`): a simulated rank may stand
for other ranks of the same program. Its intents are repeated to the core for the ranks it stands
for, on their groups; a mirrored rank's call completes its lone duration (the call's steps with no
other traffic) after its own ack, with the prediction its representative made for the same call
(none if the representative has not finished it yet). A transfer to a mirrored rank leaves through
the sender's port and counts against the port of the rank standing for the receiver; a reception
from a mirrored rank completes when the rank standing for the sender has delivered its own transfers
of that step to mirrored ranks. Without mirrors the simulation is exact for the model above.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from controller.batching import Batch, RailBatcher
from controller.clock import VirtualClock
from controller.core import CoreConfig, Intent, OpusCore, Output
from controller.drivers.sim import SimOcsDriver
from controller.job import JobSpec
from controller.ocs import ApplyResult, ReconfigurationRejected
from controller.profile import CallSignature
from controller.railstate import (
    PORT_EXACT,
    RAIL_STATE,
    SHADOW_PORTS,
    job_shape,
    shadow_rails,
)
from testbed.experiment.config import RunSettings
from testbed.plan.phasebarrier import PhaseBarrier
from testbed.plan.progress import Lane
from testbed.plan.records import (
    ack_event_record,
    call_record,
    compute_record,
    iteration_record,
)
from testbed.plan.replay import COMPUTE_LANE, PlanOp
from testbed.simulator.gcpause import collector_paused
from testbed.simulator.invariants import CircuitInvariants, InvariantViolation
from testbed.simulator.network import NetworkModel
from testbed.simulator.state import Call, Conn, Flow, Mirror, Port, RankState

Record = dict[str, Any]


class SimulationError(RuntimeError):
    """The simulated run could not finish (rejected call, deadlock, broken invariant); the
    message says where."""


class PlanSimulation:
    """One run of per-rank plans on the virtual clock; build, then :meth:`run`.

    ``programs`` are the simulated ranks' plans; ``job`` holds every rank the controller knows
    (the simulated ones and those they mirror) and every group they use.
    """

    def __init__(self, programs: Mapping[int, Sequence[PlanOp]], job: JobSpec,
                 settings: RunSettings, *, network: NetworkModel, gpus_per_server: int,
                 seed: int = 0, jitter_ms: float = 0.0,
                 mirrors: Mapping[int, Sequence[Mirror]] | None = None,
                 driver: SimOcsDriver | None = None) -> None:
        self.now = 0.0
        self.net = network
        self._rng = random.Random(seed)
        self.iterations = iterations = settings.total_iterations
        self.job = job
        self.electrical = settings.mode == "baseline"
        self.rail_state = settings.effective_semantics == RAIL_STATE
        ports: dict[int, Sequence[int]] = {rail: sorted(ps)
                                           for rail, ps in job.ports_by_rail.items()}
        data_mode = "electrical" if self.electrical or self.rail_state else "ocs"
        if self.rail_state:
            ports.update(dict.fromkeys(shadow_rails(*job_shape(job)), SHADOW_PORTS))
        # ``driver``: a prepared one (more ports than the job's: spares; faults), on a
        # VirtualClock at 0
        self.driver = driver or SimOcsDriver(
            ports, 0.0 if self.electrical else settings.switching_delay, clock=VirtualClock(),
            jitter_ms=jitter_ms, seed=seed, mode="ocs",
            mode_by_rail=dict.fromkeys(job.ports_by_rail, data_mode))
        assert isinstance(self.driver.clock, VirtualClock)
        self.clock: VirtualClock = self.driver.clock
        self.config = CoreConfig.for_mode(settings.mode,
                                          RAIL_STATE if self.rail_state else PORT_EXACT,
                                          settings.rail_state_inflight,
                                          settings.rail_state_serialize_per_rank)
        # the shim's ack timeout (rail-state only): (call, group, seq) timed out / acked in time
        self._ack_timeout_s = settings.rail_state_ack_timeout_s if self.rail_state else None
        if self._ack_timeout_s is not None and mirrors:
            raise ValueError("mirrored ranks cannot time out on an ack (rail_state_ack_timeout_s)")
        self._timed_out: set[tuple[Call, str, int]] = set()
        self._in_time: set[tuple[Call, str, int]] = set()
        self._late_complete: dict[tuple[Call, str, int], Intent | None] = {}
        self.core = OpusCore(self.driver.describe(), self.config)
        # the artifact shim's topo_ready: :mod:`testbed.plan.phasebarrier`
        self._barrier = (PhaseBarrier(programs, provisioning=self.config.provisioning)
                         if settings.rail_state_phase_barrier and self.rail_state else None)
        self.gpus = gpus_per_server
        self.ranks = {r: RankState(r, list(ops), iterations) for r, ops in programs.items()}
        self.mirrors = {r: list(ms) for r, ms in (mirrors or {}).items()}
        if self.mirrors and any(op.segments or any(s.sync for s in op.steps)
                                for ops in programs.values() for op in ops):
            raise ValueError("mirrored ranks cannot stand for calls with segments or sync steps")
        self.rep_of = {m.rank: r for r, ms in self.mirrors.items() for m in ms}
        self._mirror_of = {m.rank: m for ms in self.mirrors.values() for m in ms}
        self.ports = {r: rp.ports for r, rp in job.ranks.items()}
        self.invariants = CircuitInvariants(job, self.driver)
        self.egress: dict[tuple[int, int], Port] = {}
        self.ingress: dict[tuple[int, int], Port] = {}
        self.records: list[Record] = []
        self.events: list[dict[str, Any]] = []
        self.counters = {"events": 0, "flows": 0, "mirror_unpredicted": 0}
        if self._ack_timeout_s is not None:
            self.counters.update(ack_timeouts=0, late_acks=0)
        self._flows = 0  # flows started (counters["flows"] at the end)
        self._routes: dict[tuple[int, int], tuple[int, Port, Port]] = {}  # (a, b) -> epoch, ports
        # the event queue: events run in order of time, then of scheduling (FIFO); one deque
        # of (fn, args) per distinct time and a heap of those times (see _at)
        self._times: list[float] = []
        self._buckets: dict[float, deque[tuple[Callable[..., None], tuple[Any, ...]]]] = {}
        self._payload_bps = network.payload_bps
        self._latency_s = network.latency_s
        self._batcher = RailBatcher()
        # (mirrored rank, its lane) -> (representative, its lane)
        self._mirror_lane = {(m.rank, mine): (r, theirs) for r, ms in self.mirrors.items()
                             for m in ms for theirs, mine in m.lanes.items()}
        self._rep_next: dict[tuple[int, str, int], Intent | None] = {}
        self._mirror_sends: dict[tuple[int, str], list[int]] = {}
        self._lone_s: dict[int, float] = {}
        self._signatures: dict[tuple[str, int], CallSignature] = {}  # (group, id(op))
        self._finished = 0
        self._open: dict[Call, None] = {}  # calls in progress, for deadlock reports
        # sync steps: (it, cid, receiver, step) whose receptions are posted, and the flows that
        # wait for that before they start (a rendezvous, as NCCL's sends wait for the receive)
        self._posted: set[tuple[int, str, int, int]] = set()
        self._held: dict[tuple[int, str, int, int], list[tuple[float, Flow]]] = {}
        self._absorb(self.core.register_job(job, 0.0))

    # ----------------------------------------------------------------- plumbing

    def _at(self, t_s: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` at ``t_s`` (>= now), after every event scheduled before for then.

        Equivalent to a heap of (time, sequence number) but cheaper: many events of a symmetric
        job fall on one time, and they share a bucket (no heap operation).
        """
        bucket = self._buckets.get(t_s)
        if bucket is None:
            self._buckets[t_s] = deque(((fn, args),))
            heapq.heappush(self._times, t_s)
        else:
            bucket.append((fn, args))

    def _drop_events(self, keep: Collection[Callable[..., Any]]) -> None:
        """Forget every scheduled event whose function is not in ``keep``."""
        for bucket in self._buckets.values():
            kept = [e for e in bucket if e[0] in keep]
            bucket.clear()
            bucket.extend(kept)

    def _control_s(self) -> float:
        """One message between a rank and the controller."""
        jitter = self.net.control_jitter_s
        return self.net.control_s + (self._rng.expovariate(1 / jitter) if jitter else 0.0)

    def _emit(self, rank: int, **record: Any) -> None:
        record["rank"] = rank
        self._record(record)

    def _record(self, record: Record) -> None:
        """Keep one rank record (a :mod:`testbed.plan.records` one, or another event)."""
        self.records.append(record)

    def run(self) -> tuple[list[Record], list[dict[str, Any]]]:
        """Run every iteration of every rank; returns (records, controller events)."""
        for r in sorted(self.ranks):
            st = self.ranks[r]
            self._emit(r, ev="started", t=0.0, lanes=[ln.name for ln in st.lanes])
            self._start_iteration(st)
        times = self._times
        buckets = self._buckets
        pop = heapq.heappop
        clock = self.clock
        n = 0
        try:
            with collector_paused():  # see there: a fifth of the run's CPU time
                while times:
                    t_s = pop(times)
                    bucket = buckets[t_s]
                    if bucket:  # empty if a failover dropped its events
                        if t_s > self.now:
                            self.now = t_s
                            clock.advance_to(t_s)
                        popleft = bucket.popleft
                        while bucket:  # events scheduled for now while it runs join its end
                            fn, args = popleft()
                            fn(*args)
                            n += 1
                    del buckets[t_s]
        except InvariantViolation as exc:
            raise SimulationError(f"invariant violated: {exc}") from exc
        self.counters["events"] = n
        self.counters["flows"] = self._flows
        if self._finished < len(self.ranks):
            calls = [f"rank {c.rank.rank} {c.group}#{c.seq} ({c.op.tag}, iteration {c.it}): "
                     + (f"step {c.k}, {c.waiting} receptions and {c.undelivered} sends open"
                        if c.t_ack else "not acknowledged") for c in list(self._open)[:6]]
            raise SimulationError(
                f"deadlock at t={self.now:.6f} s: {len(self.ranks) - self._finished} ranks did "
                f"not finish; calls in progress: {'; '.join(calls) or 'none'}; calls pending "
                f"at the controller: {self.core.pending()[:6]}")
        return self.records, self.events

    # --------------------------------------------------------------- controller

    def _absorb(self, out: Output) -> None:
        if out.events:
            self.events.extend(out.events)
        for rej in out.rejects:
            if isinstance(rej.ref, Call):
                c = rej.ref
                raise SimulationError(
                    f"rank {c.rank.rank} failed in iteration {c.it} at op {c.op.index} "
                    f"({c.op.tag}, lane {c.lane.name}): the controller refused: {rej.code}: "
                    f"{rej.message}")
            raise SimulationError(f"the controller refused a mirrored request: {rej.code}: "
                                  f"{rej.message}")
        for dec in out.decisions:
            for batch in self._batcher.submit(dec):
                self._begin(batch)
        if self._barrier is not None and self._barrier.waiting:
            self._barrier_poll()
        if out.acks:
            self.invariants.acked(out.acks, self.now)
        for ack in out.acks:
            if isinstance(ack.ref, Call):
                if self._ack_timeout_s is not None:
                    self._at(self.now + self._control_s(), self._ack_arrived, ack.ref,
                             ack.group_id, ack.seq, ack.reconfigured)
                    continue
                self._at(self.now + self._control_s(), self._acked, ack.ref, ack.reconfigured)
                continue
            rep, lane = self._mirror_lane[(ack.rank, ack.group_id)]
            ops = self.ranks[rep].lanes_by_name[lane].ops
            t_s = (self._control_s() + self._control_s()
                   + self._lone_duration_s(ops[ack.seq % len(ops)]))
            self._at(self.now + t_s, self._mirror_end, ack.rank, ack.group_id, ack.seq, rep,
                     lane)

    def _begin(self, batch: Batch) -> None:
        self.invariants.request(batch, self.now)
        try:
            results = self.driver.begin(batch.reconfs)
        except ReconfigurationRejected as exc:  # with the waiting decisions planned on it
            _batch, behind, more = self._batcher.failed(batch.batch_id)
            self._absorb(self.core.reconfigs_failed(
                [d.decision_id for d in batch.decisions], str(exc), self.now,
                withdrawn=[d.decision_id for d in behind]))
            for b in more:
                self._begin(b)
            return
        self.invariants.applied(batch.reconfs)
        t_light = max((r.t_light_s for r in results), default=self.now)
        self._at(t_light + self.net.switch_overhead_s, self._lit, batch, results)

    def _lit(self, batch: Batch, results: list[ApplyResult]) -> None:
        _batch, more = self._batcher.finished(batch.batch_id)
        split = batch.split(results)
        for dec in batch.decisions:
            self._absorb(self.core.reconfig_done(dec.decision_id, split[dec.decision_id],
                                                 self.now))
        for b in more:
            self._begin(b)

    # -------------------------------------------------------------------- ranks

    def _start_iteration(self, st: RankState) -> None:
        st.profile.mark_iteration()
        st.t_start = self.now
        for lane in st.start_iteration():
            self._advance(lane)

    def _advance(self, lane: Lane) -> None:
        """Start the lane's next op if it may run now (:meth:`RankProgress.next_op` parks it
        otherwise)."""
        op = lane.rank.next_op(lane)
        if op is None:
            return
        if op.lane == COMPUTE_LANE:
            self._at(self.now + op.duration_s, self._compute_end, lane, op, self.now)
        else:
            self._call_start(lane, op)

    def _op_done(self, lane: Lane, op: PlanOp) -> None:
        st = lane.rank
        it = lane.it
        waiting = st.op_done(lane, op)
        if waiting:
            for w in waiting:
                self._advance(w)
        self._advance(lane)
        if not st.left[it]:
            self._record(cast(Record, iteration_record(st.rank, it, st.t_start, self.now)))
            if it + 1 < self.iterations:
                self._start_iteration(st)
            else:
                self._emit(st.rank, ev="finished", t=self.now,
                           profile_mismatches=st.profile.mispredictions)
                self._finished += 1

    def _compute_end(self, lane: Lane, op: PlanOp, t_start: float) -> None:
        self._record(cast(Record, compute_record(lane.rank.rank, lane.it, op.index, t_start,
                                                 self.now)))
        self._op_done(lane, op)

    # -------------------------------------------------------------------- calls

    def _call_start(self, lane: Lane, op: PlanOp) -> None:
        barrier = self._barrier
        if barrier is not None and barrier.hold(lane.rank.rank, (lane, op)):
            return
        call = Call(lane.rank, lane, op, lane.it, self.now)
        if barrier is not None:
            barrier.started(lane.rank.rank, op.index, call)
        self._open[call] = None
        self._segment_start(call)

    def _segment_start(self, call: Call) -> None:
        """Ask for the circuits of the call's next segment (the whole call for most)."""
        st, op = call.rank, call.op
        call.seg += 1
        seg = call.segments[call.seg]
        call.group = seg.group
        call.seq = st.seq.get(seg.group, 0)
        st.seq[seg.group] = call.seq + 1
        if call.seg == 0:
            call.first_seq = call.seq
        call.seg_intent = self.now
        call.k, call.end_k = seg.first, seg.first + seg.count
        call.conns = {}
        sig = self._signatures.get((seg.group, id(op)))
        if sig is None:  # one per (group, op): immutable, so shared
            sig = self._signatures[(seg.group, id(op))] = CallSignature(seg.group, op.kind,
                                                                        op.size_bytes, op.axis)
        st.profile.observe(sig)
        if not op.gated:  # a rail-state call that does not ask: it runs at once
            self._at(self.now, self._acked, call, False)
            return
        self._at(self.now + self._control_s(), self._intent, call)

    def _intent(self, call: Call) -> None:
        op, rank, jid = call.op, call.rank.rank, self.job.job_id
        for m in self.mirrors.get(rank, ()):  # first: the representative is the last to ask
            self._absorb(self.core.intent(Intent(jid, m.rank, m.lanes[op.lane], call.seq,
                                                 op.kind, op.size_bytes, op.axis), self.now))
        self._absorb(self.core.intent(Intent(jid, rank, call.group, call.seq, op.kind,
                                             op.size_bytes, op.axis), self.now, ref=call))
        if self._ack_timeout_s is not None:  # the shim's clock started when it sent the intent
            self._at(max(self.now, call.seg_intent + self._ack_timeout_s), self._ack_timeout,
                     call, call.group, call.seq)

    def _ack_arrived(self, call: Call, group: str, seq: int, reconfigured: bool) -> None:
        """An ack reached a rank whose shim times out: go on, unless it went on already."""
        key = (call, group, seq)
        if key in self._timed_out:  # late: the shim no longer waits for it
            self._timed_out.discard(key)
            self.counters["late_acks"] += 1
            self._record(cast(Record, ack_event_record("late_ack", call.rank.rank, call.it,
                                                       call.op.index, group, seq, self.now)))
            if key in self._late_complete:
                nxt = self._late_complete.pop(key)
                self._at(self.now + self._control_s(), self._complete, call, group, seq, nxt)
            return
        self._in_time.add(key)
        self._acked(call, reconfigured)

    def _ack_timeout(self, call: Call, group: str, seq: int) -> None:
        """The shim's wait for the ack of ``call``'s segment ran out: the call goes on."""
        key = (call, group, seq)
        if key in self._in_time:
            self._in_time.discard(key)
            return
        self._timed_out.add(key)
        self.counters["ack_timeouts"] += 1
        call.ack_timeouts += 1
        self._record(cast(Record, ack_event_record("ack_timeout", call.rank.rank, call.it,
                                                   call.op.index, group, seq, self.now)))
        self._acked(call, False)

    def _acked(self, call: Call, reconfigured: bool) -> None:
        if call.seg == 0:
            call.t_ack = self.now
            if self._barrier is not None:
                self._barrier.acked(call.rank.rank, call.op.index, call)
        call.wait_s += self.now - call.seg_intent
        call.reconfigured = call.reconfigured or reconfigured
        self._step(call)

    def _step(self, call: Call) -> None:
        """Issue the current step's sends, then wait for its receptions (loops over steps)."""
        op = call.op
        steps = op.steps
        net = self.net
        st = call.rank
        while True:
            now = self.now
            if call.k >= call.end_k:
                if call.undelivered:
                    call.finishing = True
                else:
                    self._at(now + (net.finish_s if call.conns else 0.0), self._segment_end,
                             call)
                return
            step = steps[call.k]
            t = now
            if step.sync and step.recvs:  # rendezvous: the rank's receptions are posted
                key = (call.it, op.collective_id, st.rank, call.k)
                self._posted.add(key)
                for t_held, held in self._held.pop(key, ()):
                    self._enqueue_at(max(t_held, now), held)
            conns = call.conns
            for peer, n in step.sends:
                conn = conns.get(peer)
                if conn is None:
                    conn = conns[peer] = Conn()
                    t += net.connect_s  # the sender blocks in connect()
                call.sent += n
                call.undelivered += 1
                flow = Flow(call, peer, call.k, n, conn)
                if step.sync:
                    key = (call.it, op.collective_id, peer, call.k)
                    if key not in self._posted:
                        self._held.setdefault(key, []).append((t, flow))
                        continue
                # _enqueue_at, inlined (the hottest path of the engine)
                if t > now:
                    self._at(t, self._enqueue, flow)
                elif conn.busy:
                    conn.queue.append(flow)
                else:
                    conn.busy = True
                    self._flow_start(flow)
            call.last = t
            call.sync_open = len(step.sends) if step.sync else 0
            if step.recvs:
                call.waiting = len(step.recvs)
                rep_of = self.rep_of
                for peer, n in step.recvs:
                    if peer in rep_of:
                        self._expect_mirror(call, peer, n)
                        continue
                    key = (call.it, op.collective_id, peer, call.k)
                    got = st.inbox.pop(key, None)
                    if got is None:
                        st.expect[key] = (call, n)
                    else:
                        call.received += got[0]
                        call.waiting -= 1
                        if got[1] > call.last:
                            call.last = got[1]
                if call.waiting:
                    return
            if call.sync_open:
                return
            if step.recvs or (step.sync and step.sends):
                t = call.last + net.step_s
            call.k += 1
            if t > now:
                self._at(t, self._step, call)
                return

    def _received(self, call: Call, n: int) -> None:
        """One reception of the call's current step is complete (now)."""
        call.received += n
        call.waiting -= 1
        self._step_progress(call)

    def _step_progress(self, call: Call) -> None:
        """Something of the current step arrived (now); the step ends when its receptions and
        (sync steps) its sends have all arrived."""
        if self.now > call.last:
            call.last = self.now
        if not call.waiting and not call.sync_open:
            call.k += 1
            self._at(call.last + self.net.step_s, self._step, call)

    def _expect_mirror(self, call: Call, peer: int, n: int) -> None:
        """A reception from a mirrored rank: done when its representative's sends arrived."""
        rep = self.ranks[self.rep_of[peer]]
        tag = call.op.tag
        counts = self._mirror_sends.get((rep.rank, tag))
        if counts is None:
            rop = rep.by_tag[tag]
            counts = [sum(1 for p, _ in s.sends if p in self.rep_of) for s in rop.steps]
            self._mirror_sends[(rep.rank, tag)] = counts
        need = counts[call.k] if call.k < len(counts) else 0
        key = (call.it, tag, call.k)
        got = rep.mirror_box.get(key, (0, 0.0))
        if got[0] >= need:
            call.received += n
            call.waiting -= 1
            if got[1] > call.last:
                call.last = got[1]
        else:
            rep.mirror_wait.setdefault(key, []).append((call, n, need))

    def _enqueue_at(self, t_s: float, flow: Flow) -> None:
        if t_s > self.now:
            self._at(t_s, self._enqueue, flow)
        else:
            self._enqueue(flow)

    def _enqueue(self, flow: Flow) -> None:
        conn = flow.conn
        if conn.busy:
            conn.queue.append(flow)
        else:
            conn.busy = True
            self._flow_start(flow)

    def _port_index(self, a: int, b: int) -> tuple[int, int]:
        """Indices (into each rank's ports) of the ports that carry a -> b."""
        pa = self.ports[a]
        k = len(pa)
        if k == 1:
            return 0, 0
        if self.electrical:
            i = (a + b) % k
            return i, i
        return self.invariants.route(a % self.gpus, a, b) or (0, 0)

    def _flow_ports(self, a: int, b: int) -> tuple[Port, Port]:
        """The egress port of ``a`` and the ingress port (of the rank standing for ``b``) that
        carry ``a`` -> ``b`` now."""
        ia, ib = self._port_index(a, b)
        src = self.egress.get((a, ia))
        if src is None:
            src = self.egress[(a, ia)] = Port()
        key = (self.rep_of.get(b, b), ib)
        dst = self.ingress.get(key)
        if dst is None:
            dst = self.ingress[key] = Port()
        return src, dst

    def _flow_start(self, flow: Flow) -> None:
        conn = flow.conn
        epoch = self.invariants.routes_epoch
        if conn.epoch != epoch:  # a new connection, or the circuits changed since its last flow
            pair = (flow.call.rank.rank, flow.peer)
            route = self._routes.get(pair)
            if route is None or route[0] != epoch:
                route = self._routes[pair] = (epoch, *self._flow_ports(*pair))
            _epoch, conn.src, conn.dst = route
            conn.epoch = epoch
        src_flows = conn.src.flows
        dst_flows = conn.dst.flows
        flow.src, flow.dst = conn.src, conn.dst
        flow.t_last = self.now
        self._flows += 1
        src_flows.append(flow)
        dst_flows.append(flow)
        if len(src_flows) == 1 and len(dst_flows) == 1:  # alone: _rate, inlined
            flow.rate = rate = self._payload_bps  # over max(1, 1) flows: exactly itself
            flow.token += 1
            self._at(self.now + flow.bits / rate, self._flow_sent, flow, flow.token)
        else:
            self._rerate(src_flows, dst_flows)

    def _rate(self, flow: Flow) -> None:
        flow.rate = self._payload_bps / max(len(flow.src.flows), len(flow.dst.flows))
        flow.token += 1
        self._at(self.now + flow.bits / flow.rate, self._flow_sent, flow, flow.token)

    def _rerate(self, a: list[Flow], b: list[Flow]) -> None:
        now = self.now
        for f in a + [f for f in b if f not in a]:
            f.bits = max(0.0, f.bits - f.rate * (now - f.t_last))
            f.t_last = now
            self._rate(f)

    def _flow_sent(self, flow: Flow, token: int) -> None:
        if token != flow.token:
            return  # superseded by a rate change
        src, dst = flow.src.flows, flow.dst.flows
        if len(src) == 1 and len(dst) == 1:  # it was alone on both ports
            src.clear()
            dst.clear()
        else:
            src.remove(flow)
            dst.remove(flow)
            if src or dst:
                self._rerate(src, dst)
        conn = flow.conn
        if conn.queue:
            self._flow_start(conn.queue.pop(0))
        else:
            conn.busy = False
        self._at(self.now + self._latency_s, self._arrive, flow)

    def _arrive(self, flow: Flow) -> None:
        call = flow.call
        b = flow.peer
        dst = self.ranks.get(b)
        if dst is not None:
            key = (call.it, call.op.collective_id, call.rank.rank, flow.k)
            waiting = dst.expect.pop(key, None)
            if waiting is None:
                dst.inbox[key] = (flow.n, self.now)
            else:  # _received and _step_progress, inlined
                receiver = waiting[0]
                receiver.received += flow.n
                receiver.waiting -= 1
                if self.now > receiver.last:
                    receiver.last = self.now
                if not receiver.waiting and not receiver.sync_open:
                    receiver.k += 1
                    self._at(receiver.last + self.net.step_s, self._step, receiver)
        elif b in self.rep_of:
            st = call.rank
            key2 = (call.it, call.op.tag, flow.k)
            count = st.mirror_box.get(key2, (0, 0.0))[0] + 1
            st.mirror_box[key2] = (count, self.now)
            waiters = st.mirror_wait.get(key2)
            if waiters:
                keep = []
                for c, n, need in waiters:
                    if count >= need:
                        self._received(c, n)
                    else:
                        keep.append((c, n, need))
                st.mirror_wait[key2] = keep
        call.undelivered -= 1
        if call.sync_open and flow.k == call.k:  # a sync step ends when its sends arrived
            call.sync_open -= 1
            self._step_progress(call)
        if call.finishing and not call.undelivered:
            call.finishing = False
            self._at(self.now + self.net.finish_s, self._segment_end, call)

    def _segment_end(self, call: Call) -> None:
        """The segment's bytes are delivered: report it done; ask for the next or end."""
        st, op = call.rank, call.op
        now = self.now
        nxt = st.profile.predict_next()
        intent = None
        if (nxt is not None and nxt.group_id != call.group and self.config.provisioning
                and not self.rail_state):
            intent = Intent(self.job.job_id, st.rank, nxt.group_id, st.seq.get(nxt.group_id, 0),
                            nxt.kind, nxt.size_bytes, nxt.axis)
        if op.gated:
            if self._timed_out and (call, call.group, call.seq) in self._timed_out:
                # (its ack is still to come: the controller's call completes after it)
                self._late_complete[(call, call.group, call.seq)] = intent
            else:
                self._at(now + self._control_s(), self._complete, call, call.group, call.seq,
                         intent)
        if call.seg + 1 < len(call.segments):
            self._segment_start(call)
            return
        if op.predict >= 0:
            self._at(now + self._control_s(), self._predict, st, op, call)
        self._call_end(call)

    def _call_end(self, call: Call) -> None:
        st, op = call.rank, call.op
        del self._open[call]
        record = call_record(op, st.rank, call.it, call.first_seq, call.reconfigured,
                             call.t_intent, call.t_ack, self.now, call.sent, call.received)
        if op.segments:
            record["segments"] = len(call.segments)
            record["segment_wait_s"] = call.wait_s
        if call.ack_timeouts:
            record["ack_timeouts"] = call.ack_timeouts
        self._record(cast(Record, record))
        self._op_done(call.lane, op)
        if self._barrier is not None:
            self._barrier_open(st.rank, call, self._barrier.ended)

    def _complete(self, call: Call, group: str, seq: int, nxt: Intent | None) -> None:
        rank = call.rank.rank
        self.invariants.completed(group, seq)
        self._absorb(self.core.complete(self.job.job_id, rank, group, seq, self.now,
                                        ref=call, next_intent=nxt))
        if rank in self.mirrors:
            self._rep_next[(rank, group, seq)] = nxt

    def _predict(self, st: RankState, op: PlanOp, call: Call) -> None:
        """The rank names the gated call its plan provisions after ``op`` (rail-state); with
        the phase barrier, a phase's last call opens it once that call is provisioned."""
        target, seq, in_run = st.predicted(op, call.it)
        if in_run:
            self._absorb(self.core.predict(Intent(self.job.job_id, st.rank, target.lane, seq,
                                                  target.kind, target.size_bytes, target.axis),
                                           self.now))
        if self._barrier is not None and self._barrier.closed_by(st.rank, call):
            self._barrier.waiting[st.rank] = (target.lane, seq, call)
            self._barrier_poll()

    def _barrier_poll(self) -> None:
        """Open, a controller message later, the barriers whose prediction was answered."""
        assert self._barrier is not None
        for rank, call in self._barrier.poll(self.job.job_id, self.core.call_ready):
            self._at(self.now + self._control_s(), self._barrier_open, rank, call,
                     self._barrier.answered)

    def _barrier_open(self, rank: int, call: Call, met: Callable[[int, Call], Any]) -> None:
        """One condition of the barrier ``call`` holds is met: start the calls it held."""
        for held in met(rank, call):
            self._call_start(*held)

    # ---------------------------------------------------------------- mirrored

    def _mirror_end(self, rank: int, lane: str, seq: int, rep: int, rep_lane: str) -> None:
        """A mirrored rank's call is done: complete it with its representative's prediction."""
        key = (rep, rep_lane, seq)
        nxt = None
        if key in self._rep_next:
            rep_nxt = self._rep_next[key]
            mirror = self._mirror_of[rank]
            if rep_nxt is not None and rep_nxt.group_id in mirror.lanes:
                nxt = replace(rep_nxt, rank=rank, group_id=mirror.lanes[rep_nxt.group_id])
        elif self.config.provisioning:
            self.counters["mirror_unpredicted"] += 1
        self.invariants.completed(lane, seq)
        self._absorb(self.core.complete(self.job.job_id, rank, lane, seq, self.now,
                                        next_intent=nxt))

    def _lone_duration_s(self, op: PlanOp) -> float:
        """The call's duration from its ack with no other traffic and symmetric peers."""
        t_s = self._lone_s.get(id(op))
        if t_s is not None:
            return t_s
        net = self.net
        t_s = 0.0
        peers: set[int] = set()
        for step in op.steps:
            for peer, _ in step.sends:
                if peer not in peers:
                    peers.add(peer)
                    t_s += net.connect_s
            sizes = [n for _, n in step.sends] + [n for _, n in step.recvs]
            if sizes:
                t_s += net.transfer_s(max(sizes)) * max(len(step.sends), len(step.recvs), 1)
            if step.recvs:
                t_s += net.step_s
        if peers:
            t_s += net.finish_s
        self._lone_s[id(op)] = t_s
        return t_s
