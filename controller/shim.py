"""The Opus shim: the client library a rank process wraps its collectives with.

::

    shim = Shim("tcp://10.0.0.254:5555", job_id="llama", rank=3)
    for it in range(iterations):
        shim.mark_iteration()
        with shim.collective("dp0", "allgather", size_bytes=957 << 20, axis="fsdp"):
            run_allgather()   # the circuits are lit here
    shim.close()

``collective`` sends an intent, blocks until the controller acknowledges that the circuits are
lit, runs the body and reports completion (also when the body raises). The shim profiles the
first iteration (:class:`~controller.profile.CallProfile`) and attaches its prediction of the
next call to each completion, which the controller uses when provisioning is on. Under the
rail-state semantics a call may be ungated (``gated=False``: numbered and profiled, but the
controller hears nothing of it, as the public artifact's shim skips all but its request points),
and :meth:`Shim.predict` names a call ahead of time (provisioning from the rank's plan).

**Going on without the ack** (``go_on_after_s``, the rail-state ``ocs.rail_state_ack_timeout_s``,
as the artifact's shim gives up after 10 s): a call whose ack has not come that long after its
intent was sent runs anyway (its grant says ``timed_out``). The rule is the simulator's
(:mod:`testbed.simulator.engine`): the late ack is read and dropped, and the call's completion
goes to the controller once both the call ended and the late ack came (the controller's call is
still switching until then). The request's socket is handed to a drain thread that waits for
that ack and then sends the completion; the shim goes on with a fresh socket of the same
session, so a late ack can never be taken as a later call's.

Failures are explicit: :class:`IntentRejected` (the controller refused; the message says why),
:class:`ControllerUnavailable` (no answer in time, or the controller stopped answering
heartbeats). ZeroMQ reconnects by itself; after a failure the shim also starts a fresh
connection and greets the controller again, so a restarted controller is picked up by the next
call. One shim per thread: calls of one shim are sequential.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import zmq

from controller.curve import ClientKeys, client_socket
from controller.profile import CallProfile, CallSignature
from controller.protocol import ProtocolError, decode, encode


class ShimError(RuntimeError):
    """Base class of the shim's errors."""


class ControllerUnavailable(ShimError):
    """The controller did not answer in time or stopped answering heartbeats."""


class IntentRejected(ShimError):
    """The controller refused a request; ``code`` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True)
class CollectiveGrant:
    """What the ack said: the call, whether circuits had to switch, and the wait."""

    group_id: str
    seq: int
    reconfigured: bool
    wait_s: float
    timed_out: bool = False  # it went on without the ack (``go_on_after_s``)


class _WentOn(Exception):
    """The wait for an ack ran past ``go_on_after_s``: the call goes on without it."""

    def __init__(self, req: int, t_start: float) -> None:
        super().__init__(f"request {req}: no ack in time, going on")
        self.req = req
        self.t_start = t_start


@dataclass
class _LateAck:
    """A call that went on without its ack: the socket its ack will come to, and the
    completion to send once both the ack came and the call ended (``done``)."""

    sock: zmq.Socket[bytes]
    req: int
    deadline: float  # monotonic: the shim's patience (``ack_timeout_s``) from the intent
    group: str
    seq: int
    done: threading.Event
    complete: dict[str, Any] | None = None  # the completion as sent, set with ``done``


#: called from a drain thread as a late ack arrives: (group, seq, refused, time.time())
LateAckHook = Callable[[str, int, bool, float], None]


class Shim:
    """One rank's connection to the Opus controller."""

    def __init__(
        self,
        endpoint: str,
        job_id: str,
        rank: int,
        *,
        ack_timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        heartbeat_interval_s: float = 0.5,
        controller_silence_s: float = 5.0,
        profile: CallProfile | None = None,
        seqs: dict[str, int] | None = None,
        curve: ClientKeys | None = None,
        go_on_after_s: float | None = None,
        on_late_ack: LateAckHook | None = None,
    ) -> None:
        if go_on_after_s is not None and not go_on_after_s > 0:
            raise ValueError(f"go_on_after_s must be a positive number of seconds or None, "
                             f"got {go_on_after_s!r}")
        self.endpoint = endpoint
        self.curve = curve  # CURVE client keys, for a service that requires them
        self.job_id = job_id
        self.rank = rank
        self.ack_timeout_s = ack_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.controller_silence_s = controller_silence_s
        # the rail-state ack timeout: a call goes on without its ack after this long (None:
        # it waits up to ack_timeout_s, then fails); late acks are counted and reported
        self.go_on_after_s = go_on_after_s
        self.on_late_ack = on_late_ack
        self.ack_timeouts = 0
        self.late_acks = 0
        self._drains: list[threading.Thread] = []
        self._drain_lock = threading.Lock()
        self.session = uuid.uuid4().hex
        self.profile = profile if profile is not None else CallProfile()
        self._profile_lock = self.profile.lock
        self.rail: int | None = None
        self.ports: tuple[int, ...] = ()
        # next sequence number per group; shared by the shims of one rank (each group is used
        # by one of them) so that a prediction names the right call of another thread's group
        self._seq: dict[str, int] = seqs if seqs is not None else {}
        self._req = 0
        self._ctx = zmq.Context()
        self._sock: zmq.Socket[bytes] | None = None
        # a poller of the request socket, kept: Socket.poll builds and registers a new one per
        # call, a good part of the shim's own time on the ack path
        self._poller: tuple[zmq.Socket[bytes], zmq.Poller] | None = None
        self._last_pong = time.monotonic()
        self._closed = threading.Event()
        self._cancelled = threading.Event()
        self._hb_bye: str | None = None  # a session the heartbeat thread must end (retarget)
        self._hb_thread = threading.Thread(target=self._heartbeat, daemon=True,
                                           name=f"opus-shim-hb-{rank}")
        self._hb_thread.start()

    # ----------------------------------------------------------- public

    def connect(self) -> None:
        """Greet the controller now rather than at the first call (a start gate's set-up)."""
        self._socket()

    def mark_iteration(self) -> None:
        """A training iteration starts (the first one is profiled)."""
        with self._profile_lock:
            self.profile.mark_iteration()

    @contextlib.contextmanager
    def collective(self, group: str, kind: str = "", size_bytes: int = 0,
                   axis: str = "", gated: bool = True) -> Iterator[CollectiveGrant]:
        """Wait until the circuits of this call are lit, run the body, report completion;
        an ungated call only takes its number."""
        seq = self._seq.get(group, 0)
        self._seq[group] = seq + 1
        with self._profile_lock:
            self.profile.observe(CallSignature(group, kind, size_bytes, axis))
        if not gated:
            yield CollectiveGrant(group, seq, False, 0.0)
            return
        t0 = time.monotonic()
        try:
            reply = self._request(
                {"type": "intent", "group": group, "seq": seq, "kind": kind,
                 "size_bytes": size_bytes, "axis": axis},
                self.ack_timeout_s, f"circuits for group {group!r} call {seq}",
                self.go_on_after_s)
        except _WentOn as went:  # no ack in time: the call runs, its ack is drained later
            late = self._hand_off(went, group, seq)
            try:
                yield CollectiveGrant(group, seq, False, time.monotonic() - t0, timed_out=True)
            finally:
                late.complete = self._base(self._completion(group, seq))
                late.done.set()
            return
        except ShimError:
            self._seq[group] = seq  # the call did not happen: keep numbering aligned with peers
            raise
        grant = CollectiveGrant(group, seq, bool(reply.get("reconfigured")),
                                time.monotonic() - t0)
        try:
            yield grant
        finally:
            self._post(self._completion(group, seq))

    def _completion(self, group: str, seq: int) -> dict[str, Any]:
        """Call ``seq`` of ``group``'s completion, with the profile's prediction of the next
        call (when it is of another group)."""
        with self._profile_lock:
            nxt = self.profile.predict_next()
        nxt_msg = None
        if nxt is not None and nxt.group_id != group:
            nxt_msg = {"group": nxt.group_id, "seq": self._seq.get(nxt.group_id, 0),
                       "kind": nxt.kind, "size_bytes": nxt.size_bytes, "axis": nxt.axis}
        return {"type": "complete", "group": group, "seq": seq, "next": nxt_msg}

    def retarget(self, job_id: str, seqs: dict[str, int] | None = None) -> None:
        """Serve job ``job_id`` from now on (a failover registered the job again): the old
        session ends (a bye), a new one starts with fresh call numbers (``seqs``), the
        connection stays, and a :meth:`cancel` is lifted. Call it between calls only."""
        self._post({"type": "bye"})
        self._hb_bye = self.session  # the heartbeat socket's session ends too
        self.job_id = job_id
        self.session = uuid.uuid4().hex
        self._seq = seqs if seqs is not None else {}
        self._cancelled.clear()

    def cancel(self) -> None:
        """Make a request in progress (and every later one) fail with :class:`ShimError` within
        a poll slice (a quarter second): the caller abandons its calls (failover)."""
        self._cancelled.set()

    def predict(self, group: str, seq: int, kind: str = "", size_bytes: int = 0,
                axis: str = "", wait: bool = False) -> None:
        """Name call ``seq`` of ``group`` before it starts (fire-and-forget): with provisioning
        the controller counts it as this rank's ask, so the switch can start early. With
        ``wait``, return only once the controller answers that the call may run without
        waiting for its switch (the artifact's blocking provisioning request, which the phase
        barrier waits for)."""
        if self._closed.is_set():
            return
        msg = {"type": "predict", "group": group, "seq": seq, "kind": kind,
               "size_bytes": size_bytes, "axis": axis}
        if wait:
            self._request({**msg, "answer": True}, self.ack_timeout_s,
                          f"the answer to the prediction of group {group!r} call {seq}")
            return
        self._socket()  # a shim whose calls never asked greets the controller first
        self._post(msg)

    def close(self) -> None:
        """Say goodbye (the controller forgets this session) and release the sockets; first
        wait for the late acks still to come (each drain ends by the shim's patience)."""
        if self._closed.is_set():
            return
        for drain in list(self._drains):
            drain.join()
        self._closed.set()
        self._hb_thread.join(2 * self.heartbeat_interval_s + 1)
        if self._sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send(encode({"type": "bye", "shim": self.session}), zmq.NOBLOCK)
            self._sock.close(linger=200)
            self._sock = None
        self._ctx.term()

    def __enter__(self) -> Shim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------- internals

    def _base(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {**msg, "job": self.job_id, "rank": self.rank, "shim": self.session}

    def _open(self) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        client_socket(sock, self.curve)
        sock.connect(self.endpoint)
        return sock

    def _socket(self) -> zmq.Socket[bytes]:
        if self._sock is None:
            sock = self._sock = self._open()
            try:
                welcome = self._exchange(sock, {"type": "hello"}, self.connect_timeout_s,
                                         "the greeting")
            except ShimError:
                self._reset()
                raise
            self.rail = welcome.get("rail")
            self.ports = tuple(welcome.get("ports", ()))
        return self._sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def _request(self, msg: dict[str, Any], timeout_s: float, what: str,
                 go_on_after_s: float | None = None) -> dict[str, Any]:
        if self._closed.is_set():
            raise ShimError("the shim is closed")
        sock = self._socket()
        try:
            return self._exchange(sock, msg, timeout_s, what, go_on_after_s)
        except ControllerUnavailable:
            self._reset()  # start afresh next time (ZeroMQ would also reconnect by itself)
            raise

    def _exchange(self, sock: zmq.Socket[bytes], msg: dict[str, Any], timeout_s: float,
                  what: str, go_on_after_s: float | None = None) -> dict[str, Any]:
        """Send ``msg`` and return its reply; :class:`_WentOn` when ``go_on_after_s`` passes
        first (the reply is then still to come, on ``sock``)."""
        self._req += 1
        req = self._req
        sock.send(encode(self._base({**msg, "req": req})))
        t_start = time.monotonic()
        deadline = t_start + timeout_s
        go_on = t_start + go_on_after_s if go_on_after_s is not None else float("inf")
        while True:
            now = time.monotonic()
            if self._cancelled.is_set():
                raise ShimError(f"rank {self.rank} of job {self.job_id}: cancelled while "
                                f"waiting for {what}")
            if now >= go_on:
                raise _WentOn(req, t_start)
            if now >= deadline:
                raise ControllerUnavailable(
                    f"rank {self.rank} of job {self.job_id}: no answer from the Opus controller "
                    f"at {self.endpoint} for {timeout_s:.1f} s while waiting for {what}")
            silence = now - max(self._last_pong, t_start)
            if silence > self.controller_silence_s:
                raise ControllerUnavailable(
                    f"rank {self.rank} of job {self.job_id}: the Opus controller at "
                    f"{self.endpoint} stopped answering heartbeats ({silence:.1f} s) while "
                    f"waiting for {what}")
            if not self._poll(sock, int(min(deadline - now, go_on - now, 0.25) * 1000) + 1):
                continue
            try:
                reply = decode(sock.recv())
            except ProtocolError:
                continue
            if reply.get("req") != req:
                continue  # a late reply to an earlier request, or an error about a completion
            if reply.get("type") == "error":
                raise IntentRejected(str(reply.get("code")), str(reply.get("message")))
            return reply

    def _hand_off(self, went: _WentOn, group: str, seq: int) -> _LateAck:
        """Give the socket that waits for ``went``'s ack to a drain thread; the shim goes on
        with a fresh socket of the same session (no greeting: the controller knows it)."""
        assert self._sock is not None
        late = _LateAck(self._sock, went.req, went.t_start + self.ack_timeout_s, group, seq,
                        threading.Event())
        self._sock, self._poller = self._open(), None
        self.ack_timeouts += 1
        self._drains = [t for t in self._drains if t.is_alive()]
        drain = threading.Thread(target=self._drain, args=(late,), daemon=True,
                                 name=f"opus-shim-drain-{self.rank}-{group}-{seq}")
        self._drains.append(drain)
        drain.start()
        return late

    def _drain(self, late: _LateAck) -> None:
        """Wait (on ``late``'s own socket) for the ack of a call that went on without it, then
        for the call's end, and send its completion; give up at the shim's patience or when
        cancelled. A refusal that comes late completes nothing (the controller undid it)."""
        sock = late.sock
        try:
            reply = None
            while reply is None:
                left = late.deadline - time.monotonic()
                if left <= 0 or self._cancelled.is_set():
                    return
                if not sock.poll(int(min(left, 0.25) * 1000) + 1):
                    continue
                with contextlib.suppress(ProtocolError):
                    msg = decode(sock.recv())
                    if msg.get("req") == late.req:
                        reply = msg
            t_late, refused = time.time(), reply.get("type") == "error"
            with self._drain_lock:  # drains of several calls may end together
                self.late_acks += 1
            if self.on_late_ack is not None:
                self.on_late_ack(late.group, late.seq, refused, t_late)
            if refused:
                return
            while not late.done.wait(0.25):
                if self._cancelled.is_set():
                    return
            assert late.complete is not None
            with contextlib.suppress(zmq.ZMQError):
                sock.send(encode(late.complete), zmq.NOBLOCK)
        finally:
            sock.close(linger=1000)  # the completion leaves before the socket goes

    def _poll(self, sock: zmq.Socket[bytes], timeout_ms: int) -> bool:
        """Whether a message waits on ``sock`` within ``timeout_ms`` (as ``sock.poll``)."""
        if sock.closed:
            raise zmq.ZMQError(zmq.ENOTSUP)
        kept = self._poller
        if kept is None or kept[0] is not sock:
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            self._poller = kept = (sock, poller)
        return bool(kept[1].poll(timeout_ms))

    def _post(self, msg: dict[str, Any]) -> None:
        """Fire-and-forget (completion reports); queued by ZeroMQ while reconnecting."""
        if self._closed.is_set() or self._sock is None:
            return
        with contextlib.suppress(zmq.ZMQError):
            self._sock.send(encode(self._base(msg)), zmq.NOBLOCK)

    def _heartbeat(self) -> None:
        """Background thread with its own socket: keep the session alive, watch the controller.

        It wakes once per heartbeat interval (or at :meth:`close`) and then reads the pongs
        that wait in its socket, so :attr:`_last_pong` lags by at most one interval, far below
        ``controller_silence_s``. (It used to poll every 0.1 s: with 32 ranks of three shims,
        ~1000 wake-ups a second that did nothing.)
        """
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # no backlog of stale heartbeats while disconnected
        client_socket(sock, self.curve)
        sock.connect(self.endpoint)
        try:
            while not self._closed.is_set():
                old, self._hb_bye = self._hb_bye, None
                with contextlib.suppress(zmq.ZMQError):
                    if old is not None:
                        sock.send(encode({"type": "bye", "shim": old}), zmq.NOBLOCK)
                    sock.send(encode(self._base({"type": "heartbeat"})), zmq.NOBLOCK)
                if self._closed.wait(self.heartbeat_interval_s):
                    break
                while sock.poll(0):
                    sock.recv()
                    self._last_pong = time.monotonic()
        finally:
            # a shim that never made a request has only this socket's session: end it too
            with contextlib.suppress(zmq.ZMQError):
                sock.send(encode({"type": "bye", "shim": self.session}), zmq.NOBLOCK)
            sock.close(linger=200)
