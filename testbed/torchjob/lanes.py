"""One rank's collective calls on lanes: a thread per Opus comm group, its calls in issue order.

Torch-free. The backend (:mod:`testbed.torchjob.backend`) turns every ProcessGroup call into a
:class:`CallSpec` and a body (a function of a :class:`CallContext` that moves the tensors) and
:meth:`Runtime.submit`\\ s them. The lane of the call's group then runs, as the replayer's lanes
do (:mod:`testbed.emulated.replayer`): an Opus intent through its shim, the ack (the circuits
are lit), the body over :mod:`testbed.emulated.transport` (fresh connections to the peers' rail
addresses, closed before the call completes), and the completion. Lanes of one rank share a
call profile and the per-group call numbers, as NCCL communicators share a GPU. The loopback
reference run uses :class:`NullShim` (acks at once), so both runs execute the same code.

Records go to one JSON-lines file, in the replayer's format (:mod:`testbed.plan.records`) so that
the runner's progress and :mod:`testbed.metrics` read them unchanged: ``call`` (written once the
script waited for the call, or at the end for calls it never waited for), ``iteration`` (at each
optimizer step), ``error`` and ``finished``. A call record carries, besides the replayer's fields,
the torch fields ``op`` (the ProcessGroup method), ``members`` (global ranks of the torch group, in
group order), ``peer`` (send/recv), ``dtype``, ``torch_group``, ``scale_up`` (inside one server: no
Opus), ``t_issue`` and ``t_wait_start`` / ``t_wait_end`` (None if the script never waited).
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

from controller.profile import CallProfile, CallSignature
from controller.shim import CollectiveGrant
from testbed.emulated.transport import (
    Abort,
    Address,
    Inbox,
    Listener,
    Outgoing,
    TransportError,
)
from testbed.plan.records import TorchCallRecord, iteration_record, torch_call_record


class ShimLike(Protocol):
    """What a lane needs of :class:`controller.shim.Shim`."""

    def collective(self, group: str, kind: str = "", size_bytes: int = 0,
                   axis: str = "") -> contextlib.AbstractContextManager[CollectiveGrant]: ...

    def close(self) -> None: ...


ShimFactory = Callable[[CallProfile, dict[str, int]], ShimLike]


class NullShim:
    """A shim without a controller: every call is acknowledged at once (loopback, scale-up)."""

    def __init__(self, seqs: dict[str, int]) -> None:
        self._seqs = seqs

    @contextlib.contextmanager
    def collective(self, group: str, kind: str = "", size_bytes: int = 0,
                   axis: str = "") -> Iterator[CollectiveGrant]:
        seq = self._seqs.get(group, 0)
        self._seqs[group] = seq + 1
        yield CollectiveGrant(group, seq, False, 0.0)

    def close(self) -> None:
        pass


class TorchCallProfile(CallProfile):
    """Profiles a torch job's second step: its first (shape inference, lazy initialisation)
    issues calls the later steps do not. Calls before the first iteration mark are ignored."""

    def observe(self, call: CallSignature) -> bool:
        return True if self.iteration < 0 else super().observe(call)


@dataclass(frozen=True)
class CallSpec:
    """What a call is, as the backend saw it when the script issued it."""

    op: str  # the ProcessGroup method
    kind: str  # workloads.steps kind
    lane: str
    axis: str
    members: tuple[int, ...]
    size_bytes: int  # the input tensor(s)
    wire_bytes: int  # what this rank sends
    expected: int  # what this rank receives
    dtype: str = ""
    torch_group: str = ""
    peer: int = -1
    scale_up: bool = False


class Call:
    """One issued call: its record, and whether it completed and was waited for."""

    def __init__(self, spec: CallSpec, index: int, it: int, rank: int) -> None:
        self.spec = spec
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.emitted = False
        self.record: TorchCallRecord = torch_call_record(
            rank, it, index, spec.lane, spec.kind, spec.axis, expected=spec.expected,
            size_bytes=spec.size_bytes, wire_bytes=spec.wire_bytes, op=spec.op,
            members=list(spec.members), peer=spec.peer, dtype=spec.dtype,
            torch_group=spec.torch_group, scale_up=spec.scale_up, t_issue=time.time())


Body = Callable[["CallContext"], None]
Done = Callable[[BaseException | None], None]


class CallContext:
    """What a call's body uses: sends to and receptions from the group's peers.

    Data is keyed by a stream name (default: the call, ``lane:seq``, which every member of the
    instance shares; point-to-point calls name their own) and a step number.
    """

    def __init__(self, runtime: Runtime, call: Call, stream: str) -> None:
        self._rt = runtime
        self.call = call
        self.stream = stream
        self._conns: dict[tuple[int, str], Outgoing] = {}

    def send(self, peer: int, step: int, payload: memoryview, stream: str | None = None
             ) -> None:
        key = (peer, stream or self.stream)
        conn = self._conns.get(key)
        if conn is None:
            conn = self._conns[key] = Outgoing(self._rt.peers[peer],
                                               {"it": 0, "cid": key[1], "src": self._rt.rank},
                                               self._rt.io_timeout_s)
        conn.send_step(step, len(payload), payload)
        self.call.record["sent"] += len(payload)

    def recv(self, peer: int, step: int, nbytes: int, stream: str | None = None) -> bytearray:
        if self._rt.inbox.errors:
            raise TransportError(self._rt.inbox.errors[0])
        data = self._rt.inbox.take((0, stream or self.stream, peer, step), nbytes,
                                   self._rt.io_timeout_s, self._rt.aborted)
        self.call.record["received"] += len(data)
        return data

    def finish(self) -> None:
        """Close every connection once its peer has read all of it."""
        try:
            for conn in self._conns.values():
                conn.finish()
        finally:
            self.close()

    def close(self) -> None:
        """Close every connection now (the call failed)."""
        for conn in self._conns.values():
            conn.sock.close()


class Runtime:
    """A rank's lanes, transport listeners, records and iteration marks.

    ``listen`` are this rank's addresses, ``peers`` where this rank reaches each other rank:
    its rail address, or a Unix socket for the GPUs of its own server (scale-up).
    """

    def __init__(self, rank: int, *, listen: Sequence[Address],
                 peers: Mapping[int, Address], out: IO[str], io_timeout_s: float,
                 shim_factory: ShimFactory | None = None,
                 thread_init: Callable[[], None] = lambda: None) -> None:
        self.rank = rank
        self.peers = dict(peers)
        self.io_timeout_s = io_timeout_s
        self.out = out
        self._out_lock = threading.Lock()
        self._shim_factory = shim_factory
        self._thread_init = thread_init
        self.inbox = Inbox(keep_payload=True)
        self.listeners = [Listener(a, self.inbox, io_timeout_s) for a in listen]
        self.profile = TorchCallProfile()
        self.seqs: dict[str, int] = {}
        self.aborted = threading.Event()
        self.failure: dict[str, Any] | None = None
        self.iteration = 0
        self.t_iteration_start = time.time()
        self._lock = threading.Lock()
        self._lanes: dict[str, queue.Queue[tuple[Call, Body, Done] | None]] = {}
        self._threads: list[threading.Thread] = []
        self._shims: list[ShimLike] = []
        self._calls: list[Call] = []
        self.last_call: Call | None = None

    # ------------------------------------------------------------------ records

    def emit(self, **record: Any) -> None:
        line = json.dumps({**record, "rank": self.rank}, separators=(",", ":"))
        with self._out_lock:
            self.out.write(line + "\n")
            self.out.flush()

    def _emit_call(self, call: Call) -> None:
        with self._lock:
            if call.emitted:
                return
            call.emitted = True
        self.emit(**call.record)

    def waited(self, call: Call, t_start: float, t_end: float) -> None:
        """The script waited for ``call`` from ``t_start`` to ``t_end`` (the first wait counts)."""
        if call.record["t_wait_start"] is None:
            call.record.update({"t_wait_start": t_start, "t_wait_end": t_end})
        if call.done.is_set():
            self._emit_call(call)

    def end_iteration(self) -> None:
        """The script's optimizer stepped: an iteration ends and the next one starts."""
        t = time.time()
        self.emit(**iteration_record(self.rank, self.iteration, self.t_iteration_start, t))
        self.iteration += 1
        self.t_iteration_start = t
        with self.profile.lock:
            self.profile.mark_iteration()

    # -------------------------------------------------------------------- calls

    def submit(self, spec: CallSpec, body: Body, on_done: Done) -> Call:
        """Queue a call on its lane (started on first use); ``on_done`` runs as it ends."""
        with self._lock:
            call = Call(spec, len(self._calls), self.iteration, self.rank)
            self._calls.append(call)
            self.last_call = call
            lane = self._lanes.get(spec.lane)
            if lane is None:
                lane = self._lanes[spec.lane] = queue.Queue()
                t = threading.Thread(target=self._lane, args=(spec.lane, spec.scale_up, lane),
                                     daemon=True, name=f"lane-{spec.lane}")
                self._threads.append(t)
                t.start()
        lane.put((call, body, on_done))
        return call

    def _shim(self, scale_up: bool) -> ShimLike:
        if scale_up or self._shim_factory is None:
            return NullShim(self.seqs)
        shim = self._shim_factory(self.profile, self.seqs)
        with self._lock:
            self._shims.append(shim)
        return shim

    def _lane(self, name: str, scale_up: bool,
              calls: queue.Queue[tuple[Call, Body, Done] | None]) -> None:
        self._thread_init()
        shim: ShimLike | None = None
        while (item := calls.get()) is not None:
            call, body, on_done = item
            try:
                if self.aborted.is_set():
                    raise Abort
                if shim is None:
                    shim = self._shim(scale_up)
                self._run(shim, call, body)
            except BaseException as exc:
                self._failed(name, call, exc)
                call.error = exc
            call.done.set()
            on_done(call.error)
            if call.record["t_wait_start"] is not None:
                self._emit_call(call)

    def _run(self, shim: ShimLike, call: Call, body: Body) -> None:
        rec, spec = call.record, call.spec
        rec["t_intent"] = time.time()
        with shim.collective(spec.lane, spec.kind, spec.size_bytes, spec.axis) as grant:
            rec.update({"t_ack": time.time(), "seq": grant.seq,
                        "reconfigured": grant.reconfigured, "cid": f"{spec.lane}:{grant.seq}",
                        "tag": f"{spec.lane}.c{grant.seq}"})
            ctx = CallContext(self, call, rec["cid"])
            try:
                body(ctx)
            except BaseException:
                ctx.close()
                raise
            ctx.finish()
        rec["t_end"] = time.time()

    def _failed(self, lane: str, call: Call, exc: BaseException) -> None:
        if isinstance(exc, Abort):
            return
        with self._lock:
            if self.failure is None:
                self.failure = {"it": call.record["it"], "i": call.record["i"],
                                "tag": f"{call.spec.op} on {call.spec.torch_group}",
                                "lane": lane, "error": f"{type(exc).__name__}: {exc}",
                                "traceback": traceback.format_exception(exc)}
        self.aborted.set()

    # ---------------------------------------------------------------------- end

    def close(self) -> None:
        """Stop the lanes, write the records of calls never waited for, release sockets."""
        with self._lock:
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.put(None)
        for t in self._threads:
            t.join(5.0)
        for call in list(self._calls):
            if call.done.is_set():
                self._emit_call(call)
        for shim in self._shims:
            shim.close()
        for listener in self.listeners:
            listener.close()
