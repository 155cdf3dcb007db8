"""The rank process: replays a rank's plan as timed compute and real TCP collectives.

Run inside the rank's Mininet namespace by the runner::

    python -m testbed.emulated.replayer RANK_PLAN.json

The plan file (written by :mod:`testbed.emulated.supervisor`) is a
:class:`testbed.plan.rankplan.RankPlan` with a :class:`~testbed.plan.rankplan.ReplayPart`
(``endpoint`` is the Opus controller on the frontend network, ``addr`` this rank's rail address,
``peers`` rank -> rail address, ``records`` the JSON-lines file), or a standby spare's
:class:`~testbed.plan.rankplan.StandbyPlan`.

Lanes run as threads (see :mod:`testbed.plan.replay`); each comm-group lane wraps every call in its
own :class:`~controller.shim.Shim`, all sharing one call profile so provisioning predicts across
the rank's groups. Under rail-state semantics a call the plan does not gate runs without asking,
and after a call with ``predict`` the rank names that call to the controller
(:mod:`testbed.plan.requestpoints`); with ``rail_state_ack_timeout_s`` a call goes on without
an ack that has not come that long after its intent (:class:`~controller.shim.Shim`'s
``go_on_after_s``), recorded as ``ack_timeout`` and, as the ack comes, ``late_ack``
(:func:`testbed.plan.records.ack_event_record`). With ``artifact`` in the plan
(``artifact_protocol``) the shims speak the public Opus artifact's line protocol over one TCP
connection instead (:mod:`controller.artifact_client`). Inside a call, the steps travel over
:mod:`testbed.emulated.transport`: one fresh TCP connection per peer to the peer's rail address
(only there: the circuits are lit), introduced with the iteration, collective id, sender and
epoch, filler bytes counted by the receiving rank's listener per (iteration, collective, sender,
step) in the epoch's inbox, so a receiving step just waits for its count; a ``sync`` step is a
rendezvous (the transport's ``READY``/``SYNC`` answers). A call with segments
(:mod:`testbed.plan.replay`) runs each segment as its own shim call and finishes its connections
before the next, whose circuits may be others. A verify plan's calls carry real data
(:mod:`testbed.plan.verify`): the hello asks the receiver to keep the bytes, and the call's
record says whether every block the rank owns ended right (``verified``).
A call (segment) the controller refuses because its switch failed (``reconfig_failed``) is asked for
again, up to :data:`controller.protocol.CALL_RETRIES` times per call. Which op a lane runs next
(dependencies, iteration boundaries) and which call a rank predicts are the rules of
:mod:`testbed.plan.progress`, which the simulator follows too. Records go to the ``records``
file as JSON lines: ``call``, ``compute`` and ``iteration`` (:mod:`testbed.plan.records`),
``error`` and ``finished``, and ``gate`` when the plan has one (``run.start_gate``: every lane's
shim greets the controller, then the rank waits for every rank at :mod:`testbed.emulated.gate`
before its first op);
on any failure the process records the rank, iteration and op and exits with status 1.

**Failover** (``failover`` in the plan: the run has spares or restarts ranks). The iterations run
in *epochs*: one epoch is one attempt at the remaining iterations with its own job id, shims,
sequence numbers, inbox and sockets. The runner steers epochs through a control file (JSON,
replaced atomically) that every replayer polls every :data:`CONTROL_POLL_S`:
``{"epoch": E, "state": "abort" | "run", "job": J, "start_it": K, "takeover": {HOST: {...}}}``.
A newer epoch aborts the running one at once (lanes stop, sockets are shut, shims cancelled); with
``state: run`` the replayer starts epoch E from iteration K. A lane that fails inside an epoch
(a peer died: refused calls, I/O errors) records ``stalled`` and waits for the runner instead of
exiting. A spare runs in *standby* (``standby`` in its plan): it waits for a control naming its
host under ``takeover``, then loads that rank's plan and runs as that rank. A NIC watchdog checks
the rail interfaces (``watch_intfs``) every :data:`WATCHDOG_S`: without carrier the rank records
``fault`` and exits with status :data:`NIC_DOWN_STATUS`, as a job whose NIC died would. Faults
scheduled for this rank (``faults``: kill, link_down, hang at an iteration) fire as that
iteration starts. ``OPUS_FAULT_CRASH=RANK:ITERATION`` (tests) makes that rank exit abruptly
(status 7) as the iteration starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from controller.artifact_client import ArtifactRank, ArtifactShim, CommPlan
from controller.profile import CallProfile
from controller.protocol import may_retry
from controller.shim import IntentRejected, Shim
from testbed.emulated.gate import GatePaths, RankGate
from testbed.emulated.relay import Relay
from testbed.emulated.transport import READY_FLAG, SYNC_FLAG, Abort, Inbox, Listener, Outgoing
from testbed.emulated.transport import TransportError as ReplayError
from testbed.metrics import tcpstats
from testbed.plan.phasebarrier import PhaseBarrier
from testbed.plan.progress import Lane, RankProgress
from testbed.plan.rankplan import RankPlan, RankPlanError, ReplayPart, StandbyPlan, load_plan
from testbed.plan.records import (
    ack_event_record,
    call_record,
    compute_record,
    iteration_record,
)
from testbed.plan.replay import COMPUTE_LANE, PlanOp
from testbed.plan.verify import CallData

POLL_S = 0.25
CONTROL_POLL_S = 0.02
WATCHDOG_S = 0.02
#: The shim's heartbeat interval and its patience with a silent controller at time dilation 1
#: (controller.shim's defaults), times the run's dilation.
HEARTBEAT_INTERVAL_S = 0.5
CONTROLLER_SILENCE_S = 5.0
NIC_DOWN_STATUS = 8
#: a lane's shim: the project's ZeroMQ one, or one that speaks the artifact's protocol
AnyShim = Shim | ArtifactShim
_SIOCGIFFLAGS = 0x8913
_IFF_UP, _IFF_RUNNING = 0x1, 0x40


class EpochInbox(Inbox):
    """An epoch's inbox: once the epoch is aborted, its connections' errors are the abort's."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = threading.Event()

    def fail(self, message: str) -> None:
        if not self.closed.is_set():
            super().fail(message)

    def close(self) -> None:
        self.closed.set()
        self.wake()


class Epoch:
    """One attempt at iterations ``start..`` under job ``job``: abortable as a whole.

    ``progress`` (guarded by ``lock``) says which op each lane runs; a lane it parks sleeps on
    its ``wake`` event until a lane that finished an op (or the start of an iteration) hands it
    back; ``ended[it]`` is set when every op of iteration ``it`` is done.
    :meth:`abort` wakes every waiter at once (each event is set; waiters then see ``aborted``),
    shuts the epoch's sockets so that blocked sends and receives return, and cancels its shims.
    """

    def __init__(self, number: int, job: str, start: int, iterations: int, ops: list[PlanOp],
                 inbox: EpochInbox, barrier: PhaseBarrier | None = None) -> None:
        self.number = number
        self.job = job
        self.start = start
        self.aborted = threading.Event()
        self.inbox = inbox
        self.progress = RankProgress(ops, iterations, start)
        self.lock = threading.Lock()
        self.wake = {lane.name: threading.Event() for lane in self.progress.lanes}
        self.ended = {it: threading.Event() for it in range(start, iterations)}
        self.barrier = barrier  # the artifact shim's phase barrier (on demand), under ``lock``
        self.seqs: dict[str, int] = {}  # next call number per group, shared by the lanes' shims
        self.failure: dict[str, Any] | None = None
        self._socks: set[socket.socket] = set()
        self._shims: list[AnyShim] = []
        self._lock = threading.Lock()

    def track(self, sock: socket.socket) -> None:
        """Shut ``sock`` when the epoch aborts (at once if it already has)."""
        with self._lock:
            self._socks.add(sock)
        if self.aborted.is_set():
            _shut(sock)

    def untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.discard(sock)

    def add_shim(self, shim: AnyShim) -> None:
        with self._lock:
            self._shims.append(shim)
        if self.aborted.is_set():
            shim.cancel()

    def fail(self, failure: dict[str, Any]) -> None:
        """The first real failure of the epoch (not one the abort itself caused)."""
        with self._lock:
            if self.failure is None and not self.aborted.is_set():
                self.failure = failure
        self.abort()

    def abort(self) -> None:
        if self.aborted.is_set():
            return
        self.aborted.set()
        for ev in list(self.wake.values()) + list(self.ended.values()):
            ev.set()
        self.inbox.close()
        with self._lock:
            socks, shims = list(self._socks), list(self._shims)
        for sock in socks:
            _shut(sock)
        for shim in shims:
            shim.cancel()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def link_up(intf: str) -> bool:
    """True while ``intf`` (in this namespace) is up and has carrier."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, struct.pack("16s24x", intf.encode()))
        except OSError:
            return False
    flags = struct.unpack("16sH22x", raw[:40])[1]
    return flags & (_IFF_UP | _IFF_RUNNING) == (_IFF_UP | _IFF_RUNNING)


class Replayer:
    """One rank's replay (or a standby spare's wait for a rank); :meth:`run` returns the exit
    status."""

    replay: ReplayPart  # what the adopted rank runs

    def __init__(self, plan: RankPlan | StandbyPlan, opener: Callable[..., IO[str]] = open
                 ) -> None:
        self.plan = plan
        self._opener = opener
        fo = plan.failover
        self.failover: dict[str, Any] | None = dict(fo) if fo else None
        self.out: IO[str] = opener(plan.records, "a", encoding="utf-8")
        self._out_lock = threading.Lock()
        self._stop = threading.Event()
        self._inboxes: dict[int, EpochInbox] = {}
        self._inbox_lock = threading.Lock()
        self.current: Epoch | None = None
        self._shims: dict[str, AnyShim] = {}  # per lane, kept across epochs (retargeted)
        self._artifact: ArtifactRank | None = None  # the artifact's protocol (``artifact``)
        self._control: dict[str, Any] = {}
        self._control_cv = threading.Condition()
        self.profile = CallProfile()
        # calls that went on without their ack: (group, seq) -> (it, i) until the late ack
        # comes; a late ack that beats its call's entry waits in _early (t, refused)
        self._went_on: dict[tuple[str, int], tuple[int, int]] = {}
        self._early: dict[tuple[str, int], tuple[float, bool]] = {}
        self._late_lock = threading.Lock()
        if isinstance(plan, RankPlan):
            self._adopt(plan)

    def _adopt(self, plan: RankPlan) -> None:
        """Become the rank of ``plan`` (a replayed rank's: :class:`RankPlanError` if not)."""
        if plan.replay is None:
            raise RankPlanError(f"rank {plan.rank}: the plan runs a torch script, not a replay "
                                "(testbed.torchjob.launcher runs it)")
        self.plan = dataclasses.replace(plan, failover=self.failover)
        self.replay = plan.replay
        self.rank = plan.rank
        self.ops = list(plan.replay.ops)
        self.iterations = plan.replay.iterations
        self.peers = {r: str(a) for r, a in plan.peers.items()}
        self.port = plan.replay.port
        # the static plane's paths (issue 40): stations after this rank, per collective, peer
        self.routes = plan.replay.routes or {}
        self.relay = Relay(plan.io_timeout_s)
        self.endpoint = str(plan.endpoint)
        self.io_timeout_s = plan.io_timeout_s
        self.ack_timeout_s = plan.ack_timeout_s
        # every modelled time runs k times longer (testbed.experiment.dilation): the compute
        # waits here, the shim's heartbeats and its patience with a silent controller
        self.time_dilation = plan.time_dilation
        self.job = plan.job

    def emit(self, **record: Any) -> None:
        rank = getattr(self, "rank", None)
        line = json.dumps({**record, "rank": rank}, separators=(",", ":"))
        with self._out_lock:
            self.out.write(line + "\n")
            self.out.flush()

    def _epoch_fields(self, ep: Epoch) -> dict[str, Any]:
        return {"epoch": ep.number} if self.failover else {}

    def _inbox(self, epoch: int) -> EpochInbox | None:
        """The inbox of ``epoch`` (made when a peer got there first); None for a past one."""
        with self._inbox_lock:
            cur = self.current.number if self.current is not None else -1
            if epoch < cur:
                return None
            if epoch not in self._inboxes:
                self._inboxes[epoch] = EpochInbox()
            for old in [e for e in self._inboxes if e < cur]:
                del self._inboxes[old]
            return self._inboxes[epoch]

    # ------------------------------------------------------------------ lanes

    @staticmethod
    def _wait(ep: Epoch, ev: threading.Event) -> None:
        while not ev.wait(POLL_S):
            if ep.aborted.is_set():
                raise Abort
        if ep.aborted.is_set():
            raise Abort

    def _lane(self, ep: Epoch, lane: Lane) -> None:
        """Run the lane's ops as :class:`RankProgress` hands them out; sleep while it is
        parked."""
        name, progress, wake = lane.name, ep.progress, ep.wake[lane.name]
        shim: AnyShim | None = None
        current: tuple[int, PlanOp] | None = None
        try:
            if name != COMPUTE_LANE:
                shim = self._shim(ep, name)
                ep.add_shim(shim)
            while True:
                with ep.lock:
                    wake.clear()  # before it may be parked: a later hand-back sets it
                    op = progress.next_op(lane)
                    if op is None and progress.lane_finished(lane):
                        return
                if op is None:
                    self._wait(ep, wake)
                    continue
                it = lane.it
                current = (it, op)
                if shim is None:
                    self._compute(ep, it, op)
                else:
                    self._call(ep, shim, it, op)
                with ep.lock:
                    woken = progress.op_done(lane, op)
                    ended = progress.iteration_done(it)
                for other in woken or ():
                    ep.wake[other.name].set()
                if ended:
                    ep.ended[it].set()
        except Abort:
            pass
        except BaseException as exc:  # record and stop the whole epoch
            it, failed = current if current else (-1, None)
            ep.fail({"it": it, "i": failed.index if failed else -1,
                     "tag": failed.tag if failed else "", "lane": name,
                     "error": f"{type(exc).__name__}: {exc}"})

    def _artifact_rank(self, ep: Epoch) -> ArtifactRank | None:
        """The rank's side of the artifact's protocol, when the plan has ``artifact``
        (:mod:`controller.artifact_client`; its connection checks in every comm of the rank)."""
        art = self.replay.artifact
        if art and self._artifact is None:
            self._artifact = ArtifactRank(
                str(art["host"]), int(art["port"]), int(art["local_rank"]),
                {g: CommPlan.from_json(c) for g, c in art["comms"].items()},
                ack_timeout_s=self.ack_timeout_s, job_id=ep.job, seqs=ep.seqs,
                go_on_after_s=self.replay.rail_state_ack_timeout_s, on_late_ack=self._late_ack)
        return self._artifact

    def _shim(self, ep: Epoch, lane: str) -> AnyShim:
        """The lane's shim, retargeted to ``ep``'s job if an earlier epoch used it: a failover
        then costs no new connection per lane."""
        shim = self._shims.get(lane)
        artifact = self._artifact_rank(ep)
        if shim is None and artifact is not None:
            shim = self._shims[lane] = artifact.shim()
        elif shim is None:
            shim = self._shims[lane] = Shim(
                self.endpoint, ep.job, self.rank, ack_timeout_s=self.ack_timeout_s,
                heartbeat_interval_s=HEARTBEAT_INTERVAL_S * self.time_dilation,
                controller_silence_s=CONTROLLER_SILENCE_S * self.time_dilation,
                profile=self.profile, seqs=ep.seqs,
                go_on_after_s=self.replay.rail_state_ack_timeout_s, on_late_ack=self._late_ack)
        elif shim.job_id != ep.job:
            shim.retarget(ep.job, ep.seqs)
        return shim

    def _went_on_without_ack(self, it: int, op: PlanOp, group: str, seq: int,
                             t: float) -> None:
        """Call ``seq`` of ``group`` went on without its ack at ``t`` (its late ack may
        have come already)."""
        self.emit(**ack_event_record("ack_timeout", self.rank, it, op.index, group, seq, t))
        with self._late_lock:
            early = self._early.pop((group, seq), None)
            if early is None:
                self._went_on[(group, seq)] = (it, op.index)
        if early is not None:
            self._emit_late(it, op.index, group, seq, *early)

    def _late_ack(self, group: str, seq: int, refused: bool, t: float) -> None:
        """A shim's drain read the late ack of a call that went on (a drain thread)."""
        with self._late_lock:
            where = self._went_on.pop((group, seq), None)
            if where is None:
                self._early[(group, seq)] = (t, refused)
        if where is not None:
            self._emit_late(*where, group, seq, t, refused)

    def _emit_late(self, it: int, i: int, group: str, seq: int, t: float,
                   refused: bool) -> None:
        self.emit(**ack_event_record("late_ack", self.rank, it, i, group, seq, t),
                  **({"refused": True} if refused else {}))

    def _close_shims(self) -> None:
        for shim in self._shims.values():
            with contextlib.suppress(Exception):  # the end of a rank must not fail on its bye
                shim.close()
        self._shims.clear()
        if self._artifact is not None:
            self._artifact.close()

    def _compute(self, ep: Epoch, it: int, op: PlanOp) -> None:
        t0 = time.time()
        end = time.monotonic() + op.duration_s * self.time_dilation
        while (left := end - time.monotonic()) > 0:
            if ep.aborted.wait(min(left, POLL_S)):
                raise Abort
        self.emit(**compute_record(self.rank, it, op.index, t0, time.time()),
                  **self._epoch_fields(ep))

    def _hold(self, ep: Epoch, barrier: PhaseBarrier, op: PlanOp, token: object) -> None:
        """Start call ``op`` (``token``) only once the rank's phase barrier is open."""
        with ep.lock:
            opened = threading.Event()
            held = barrier.hold(self.rank, (opened,))
        if held:
            self._wait(ep, opened)
        with ep.lock:
            barrier.started(self.rank, op.index, token)

    def _call(self, ep: Epoch, shim: AnyShim, it: int, op: PlanOp) -> None:
        barrier, token = ep.barrier, object()  # the call, as the barrier knows it
        if barrier is not None:
            self._hold(ep, barrier, op, token)
        t_intent = time.time()
        data = CallData(op.blocks, op.collective_id, it, self.rank) if op.blocks else None
        moved = [0, 0]  # sent, received
        first: tuple[int, float] | None = None  # the first segment's seq and ack
        wait_s, reconfigured, retries, timeouts = 0.0, False, 0, 0
        for seg in op.call_segments:
            t_ask = time.time()
            while True:
                try:
                    with shim.collective(seg.group, op.kind, op.size_bytes, op.axis,
                                         op.gated) as grant:
                        t_ack = time.time()
                        if grant.timed_out:  # it goes on without the light
                            timeouts += 1
                            self._went_on_without_ack(it, op, grant.group_id, grant.seq, t_ack)
                        if barrier is not None and first is None:
                            with ep.lock:  # on demand, a phase's last call closes at its ack
                                barrier.acked(self.rank, op.index, token)
                        self._steps(ep, it, op, range(seg.first, seg.first + seg.count), data,
                                    moved)
                    break
                except IntentRejected as exc:  # refused before any byte of the segment moved
                    if not may_retry(exc.code, retries):
                        raise
                    retries += 1  # the switch refused; the controller undid it: ask again
            first = first or (grant.seq, t_ack)
            wait_s += t_ack - t_ask
            reconfigured = reconfigured or grant.reconfigured
        assert first is not None
        extra: dict[str, Any] = {"retries": retries} if retries else {}
        if timeouts:
            extra["ack_timeouts"] = timeouts
        if op.segments:
            extra.update(segments=len(op.segments), segment_wait_s=wait_s)
        if data is not None:
            wrong = data.wrong_blocks()
            extra.update(verified=not wrong, wrong_blocks=wrong, owned_bytes=data.owned_bytes())
        self.emit(**call_record(op, self.rank, it, first[0], reconfigured, t_intent, first[1],
                                time.time(), moved[0], moved[1]),
                  **extra, **self._epoch_fields(ep))
        if barrier is not None:
            with ep.lock:
                opened = list(barrier.ended(self.rank, token))
            for (held,) in opened:
                held.set()
        if op.predict >= 0:  # call numbers restart with each epoch's job
            with ep.lock:
                target, seq, in_run = ep.progress.predicted(op, it)
                # with provisioning, a phase's last call opens the barrier only once its
                # prediction is answered (the artifact's blocking topoprovision)
                answer = barrier is not None and barrier.provisioning and barrier.closed_by(
                    self.rank, token)
            if in_run:
                shim.predict(target.lane, seq, target.kind, target.size_bytes, target.axis,
                             wait=answer)
            if answer:
                assert barrier is not None
                with ep.lock:
                    opened = list(barrier.answered(self.rank, token))
                for (held,) in opened:
                    held.set()

    def _steps(self, ep: Epoch, it: int, op: PlanOp, steps: range, data: CallData | None,
               moved: list[int]) -> None:
        """Run ``steps`` of a call (one segment) on connections of their own, finished before
        the segment ends; adds the bytes sent and received to ``moved``."""
        conns: dict[int, Outgoing] = {}
        hello = {"it": it, "cid": op.collective_id, "src": self.rank, "epoch": ep.number,
                 "keep": data is not None}
        inbox = ep.inbox
        try:
            for k in steps:
                step = op.steps[k]
                for peer, _n in step.sends:
                    if peer not in conns:
                        conns[peer] = self._connect(op.collective_id, peer, hello, ep)
                        ep.track(conns[peer].sock)
                if step.sync:  # rendezvous: post this rank's receptions, then wait for theirs
                    for peer, _n in step.recvs:
                        inbox.ready((it, op.collective_id, peer), k, self.io_timeout_s,
                                    ep.aborted)
                for i, (peer, n) in enumerate(step.sends):
                    if step.sync:
                        conns[peer].expect(READY_FLAG, k)
                    payload = data.outgoing(step.send_blocks[i]) if data is not None else None
                    conns[peer].send_step(k, n, payload, step.sync)
                    moved[0] += n
                for j, (peer, n) in enumerate(step.recvs):
                    if inbox.errors:
                        raise ReplayError(inbox.errors[0])
                    key = (it, op.collective_id, peer, k)
                    if data is None:
                        moved[1] += inbox.wait(key, n, self.io_timeout_s, ep.aborted)
                    else:
                        got = inbox.take(key, n, self.io_timeout_s, ep.aborted)
                        moved[1] += len(got)
                        data.incoming(step.recv_blocks[j], bytes(got))
                if step.sync:
                    for peer, _n in step.sends:
                        conns[peer].expect(SYNC_FLAG, k)
            for conn in conns.values():
                conn.finish()
        finally:
            for conn in conns.values():
                ep.untrack(conn.sock)
                conn.sock.close()

    def _relay_until_all_done(self) -> dict[str, Any]:
        """Under the static plane a rank forwards others' transfers after its own work: it
        marks itself done beside its scale-up socket and keeps listening until every rank has
        (at most its socket timeout); returns its relay's counters then."""
        folder = Path(self.replay.scale_up).parent
        (folder / f"done.r{self.rank}").touch()
        deadline = time.monotonic() + self.io_timeout_s
        ranks = len(self.peers)
        while time.monotonic() < deadline:
            if sum(1 for _ in folder.glob("done.r*")) >= ranks:
                break
            time.sleep(POLL_S / 5)
        return dict(self.relay.counters(),
                    all_done=sum(1 for _ in folder.glob("done.r*")) >= ranks)

    def _connect(self, cid: str, peer: int, hello: dict[str, Any], ep: Epoch) -> Outgoing:
        """A connection to ``peer`` for collective ``cid``: to its rail address, or under the
        static plane to the first station of the path, the others named in the hello."""
        via = self.routes.get(cid, {}).get(peer)
        if not via:
            return Outgoing((self.peers[peer], self.port), hello, self.io_timeout_s,
                            ep.aborted)
        first = via[0] if isinstance(via[0], str) else (via[0][0], int(via[0][1]))
        rest = [a if isinstance(a, str) else [a[0], a[1]] for a in via[1:]]
        return Outgoing(first, {**hello, "via": rest} if rest else hello, self.io_timeout_s,
                        ep.aborted)

    # -------------------------------------------------------------- listener

    def _route(self, hello: dict[str, Any]) -> Inbox | None:
        """An incoming connection's inbox: its epoch's (None: an abandoned epoch's)."""
        return self._inbox(int(hello.get("epoch", 0)))

    # ------------------------------------------------------------ failover

    def _read_control(self) -> dict[str, Any] | None:
        assert self.failover is not None
        try:
            with open(self.failover["control"], encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _watch_control(self) -> None:
        """Poll the control file; a newer epoch aborts the running one at once."""
        seen = -1
        while not self._stop.is_set():
            ctl = self._read_control()
            if ctl is not None and int(ctl.get("epoch", 0)) >= seen:
                seen = int(ctl.get("epoch", 0))
                with self._control_cv:
                    changed = ctl != self._control
                    self._control = ctl
                    self._control_cv.notify_all()
                cur = self.current
                if changed and cur is not None and seen > cur.number:
                    cur.abort()
            time.sleep(CONTROL_POLL_S)

    def _await_control(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        with self._control_cv:
            while not predicate(self._control):
                self._control_cv.wait(POLL_S)
            return dict(self._control)

    def _watchdog(self, intfs: list[str]) -> None:
        """No carrier on a rail interface: record it and exit, as a rank whose NIC died."""
        while not self._stop.is_set():
            for intf in intfs:
                if not link_up(intf):
                    self.emit(ev="fault", kind="nic_down", intf=intf, t=time.time())
                    self.out.flush()
                    os._exit(NIC_DOWN_STATUS)
            time.sleep(WATCHDOG_S)

    def _iteration_faults(self, it: int) -> None:
        """Faults that fire as iteration ``it`` starts (test hook, then planned faults)."""
        if os.environ.get("OPUS_FAULT_CRASH", "") == f"{self.rank}:{it}":  # "RANK:ITERATION"
            self.out.flush()
            os._exit(7)  # a crash: no record, no goodbye
        if not self.failover:
            return
        for fault in self.failover.get("faults", []):
            if fault.get("at_iteration") != it:
                continue
            self.emit(ev="fault", kind=fault["kind"], index=fault.get("index"), it=it,
                      t=time.time())
            self.out.flush()
            if fault["kind"] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault["kind"] == "hang":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif fault["kind"] == "link_down":
                for intf in self.failover.get("watch_intfs", []):
                    subprocess.run(["ip", "link", "set", "dev", intf, "down"], check=False)
                time.sleep(10 * WATCHDOG_S)  # the watchdog ends the process

    def _standby(self) -> None:
        """A spare: wait until the runner names this host to take over a rank, then become it."""
        assert self.failover is not None
        host = str(self.failover["host"])
        after = int(self.failover.get("after_epoch", 0))
        self.emit(ev="standby", host=int(host), t=time.time())
        ctl = self._await_control(lambda c: host in c.get("takeover", {})
                                  and int(c.get("epoch", 0)) > after)
        take = ctl["takeover"][host]
        self.failover.update(epoch=int(ctl["epoch"]), start_it=int(ctl["start_it"]),
                             job=str(ctl["job"]))
        rank_plan = read_plan(str(take["plan"]))
        if not isinstance(rank_plan, RankPlan):
            raise RankPlanError(f"{take['plan']}: a takeover names a standby plan, not a rank's")
        self.failover["faults"] = take.get("faults", [])
        self._adopt(rank_plan)
        self.out.close()
        self.out = self._opener(rank_plan.records, "a", encoding="utf-8")
        self.emit(ev="takeover", host=int(host), t=time.time(), epoch=int(ctl["epoch"]))

    # -------------------------------------------------------------------- run

    def _gated(self, ep: Epoch) -> bool:
        """Whether ``ep`` waits at the start gate: only the job's first start (a restarted
        or spare rank joins ranks that are already running)."""
        return self.replay.gate is not None and ep.number == 0 and ep.start == 0

    def _pass_gate(self, ep: Epoch, lanes: list[str]) -> None:
        """Set up as NCCL would before its first collective (every comm lane's shim greets
        the controller), signal loaded and wait for every rank (:mod:`testbed.emulated.gate`)."""
        gate = RankGate(GatePaths(**{k: Path(v) for k, v in (self.replay.gate or {}).items()}))
        gate.open()
        for name in lanes:
            self._shim(ep, name).connect()
        t_loaded, t_go = gate.pass_gate(self.rank)
        self.emit(ev="gate", t_loaded=t_loaded, t_go=t_go)

    def _run_epoch(self, ep: Epoch) -> str:
        """Run ``ep``: ``done``, ``aborted`` (the runner moved on) or ``failed``."""
        lanes = [lane.name for lane in ep.progress.lanes]
        if ep.start == 0 and ep.number > 0:
            self.profile = CallProfile()  # the profiled iteration runs again
        artifact = self._artifact_rank(ep)
        if artifact is not None:  # every comm checks in at start, as process groups are made
            artifact.connection()
        if self._gated(ep):
            self._pass_gate(ep, [name for name in lanes if name != COMPUTE_LANE])
        tcp_at_start = tcpstats.read()
        threads = [threading.Thread(target=self._lane, args=(ep, lane), daemon=True,
                                    name=f"lane-{lane.name}") for lane in ep.progress.lanes]
        for t in threads:
            t.start()
        if ep.number == 0:
            self.emit(ev="started", t=time.time(), lanes=lanes, tcp=tcp_at_start)
        else:
            self.emit(ev="resumed", t=time.time(), epoch=ep.number, it=ep.start,
                      host=self.failover.get("host") if self.failover else None,
                      tcp=tcp_at_start)
        try:
            for it in range(ep.start, self.iterations):
                self._iteration_faults(it)
                with self.profile.lock:
                    self.profile.mark_iteration()
                t_start = time.time()
                with ep.lock:
                    going = ep.progress.start_iteration()
                    if ep.progress.iteration_done(it):  # a plan without ops
                        ep.ended[it].set()
                for lane in going:
                    ep.wake[lane.name].set()
                self._wait(ep, ep.ended[it])
                self.emit(**iteration_record(self.rank, it, t_start, time.time()),
                          tcp=tcpstats.read(), **self._epoch_fields(ep))
        except Abort:
            pass
        for t in threads:
            t.join(5.0)
            if t.is_alive():  # stuck in its shim: that shim is not used again
                self._shims.pop(t.name.removeprefix("lane-"), None)
        if ep.failure is not None:
            return "failed"
        return "aborted" if ep.aborted.is_set() else "done"

    def run(self) -> int:
        fo = self.failover
        if fo:
            threading.Thread(target=self._watch_control, daemon=True).start()
            if isinstance(self.plan, StandbyPlan):
                self._standby()
            if fo.get("watch_intfs"):
                threading.Thread(target=self._watchdog, args=(list(fo["watch_intfs"]),),
                                 daemon=True).start()
        listener = Listener((self.replay.addr, self.port), self._route, self.io_timeout_s,
                            self.relay)
        scale_up = (Listener(self.replay.scale_up, self._route, self.io_timeout_s, self.relay)
                    if self.replay.scale_up else None)
        number = int(fo.get("epoch", 0)) if fo else 0
        start = int(fo.get("start_it", 0)) if fo else 0
        job = str(fo.get("job", self.job)) if fo else self.job
        status = 0
        while True:
            inbox = self._inbox(number)
            assert inbox is not None
            barrier = (PhaseBarrier({self.rank: self.ops},
                                    provisioning=self.replay.phase_barrier_provisioning)
                       if self.replay.phase_barrier else None)
            ep = Epoch(number, job, start, self.iterations, self.ops, inbox, barrier)
            self.current = ep
            if fo:  # a newer control may have come while we were getting here
                with self._control_cv:
                    if int(self._control.get("epoch", 0)) > number:
                        ep.abort()
            outcome = self._run_epoch(ep)
            if outcome == "done":
                held = {"barrier_holds": ep.barrier.holds} if ep.barrier is not None else {}
                relayed: dict[str, Any] = {}
                if self.replay.scale_up:  # a relay for the others until they are all done
                    relayed["relay"] = dict(self._relay_until_all_done(),
                                            done_t=time.time())
                self.emit(ev="finished", t=time.time(),
                          profile_mismatches=self.profile.mispredictions, **held, **relayed)
                break
            if outcome == "failed" and not fo:
                self.emit(ev="error", **(ep.failure or {}))
                status = 1
                break
            if outcome == "failed":
                self.emit(ev="stalled", **(ep.failure or {}), epoch=ep.number, t=time.time())
            else:
                self.emit(ev="aborted", epoch=ep.number, t=time.time())
            ctl = self._await_control(_resume_after(ep.number))
            number, job, start = int(ctl["epoch"]), str(ctl["job"]), int(ctl["start_it"])
        self._close_shims()
        self._stop.set()
        listener.close()
        if scale_up is not None:
            scale_up.close()
        return status


def _resume_after(epoch: int) -> Callable[[dict[str, Any]], bool]:
    """Does a control say: run an epoch later than ``epoch``?"""
    return lambda c: int(c.get("epoch", 0)) > epoch and c.get("state") == "run"


def read_plan(path: str) -> RankPlan | StandbyPlan:
    """The plan in the JSON file ``path``; :class:`RankPlanError` names the file and key."""
    with open(path, encoding="utf-8") as fh:
        return load_plan(json.load(fh), path)


def main(argv: list[str] | None = None, opener: Callable[..., IO[str]] = open) -> int:
    args = sys.argv[1:] if argv is None else argv
    replayer = Replayer(read_plan(args[0]), opener)
    status = replayer.run()
    replayer.out.close()
    sys.stdout.flush()
    os._exit(status)  # lanes blocked in a failed call must not keep the process alive


if __name__ == "__main__":
    sys.exit(main())
