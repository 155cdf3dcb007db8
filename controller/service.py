"""The Opus controller service: the pure core behind a ZeroMQ ROUTER socket.

One loop thread owns the core and the socket: it decodes shim messages (:mod:`controller.protocol`),
feeds them to :class:`~controller.core.OpusCore` with the current time, sends the acks and errors
the core returns, writes its events to the :class:`~controller.events.EventLog`, and hands its
decisions, batched per rail (:mod:`controller.batching`), to worker threads that call the
driver's blocking ``apply_many``; a worker reports the result back to the loop over an
in-process socket, so the loop never waits for light.

Shims send heartbeats; a shim that stops (its process died) is declared lost after
``heartbeat_timeout_s`` and the core releases its calls; later calls of groups with that rank
are refused (``peer_lost``) until the rank shows up again (a new session: a shim's hello,
heartbeat or request). Bad input is answered with an error to its sender and logged; the
service keeps serving everyone else.

Clients are authenticated with ZeroMQ CURVE (:mod:`controller.curve`) whenever the service
binds an address outside loopback and ``trusted_networks`` (the run's own frontend network):
without ``curve_keys`` it then refuses to start (:class:`~controller.curve.AuthRequired`). A
client without an authorized key never gets past the handshake; each refusal is logged and
written to the event log as ``client_refused``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import zmq

from controller.batching import Batch, RailBatcher
from controller.clock import Clock, WallClock
from controller.core import CoreConfig, OpusCore, Output
from controller.curve import (
    AuthRequired,
    ClientKeys,
    CurveServer,
    ServerKeys,
    client_socket,
    needs_auth,
)
from controller.events import EventLog
from controller.job import JobError, JobSpec
from controller.ocs import ApplyResult, OcsDriver
from controller.protocol import (
    ProtocolError,
    decode,
    encode,
    field_int,
    field_str,
    parse_intent,
    parse_next,
)

log = logging.getLogger(__name__)


@dataclass
class _Session:
    job_id: str
    rank: int
    last_seen_s: float  # time.monotonic()


class ControllerService:
    """Serve shims on ``bind`` (``tcp://HOST:PORT``; port 0 picks a free one).

    ``curve_keys``: authenticate clients (required unless ``bind`` is loopback or inside
    ``trusted_networks``: else :class:`~controller.curve.AuthRequired`); ``client_keys``:
    the service's own client key, for :meth:`register_job`; ``bind_device``: hold the socket
    to one interface (``SO_BINDTODEVICE``, root), so that only packets arriving there reach
    it.
    """

    def __init__(
        self,
        driver: OcsDriver,
        *,
        bind: str = "tcp://127.0.0.1:0",
        config: CoreConfig | None = None,
        event_log: EventLog | None = None,
        clock: Clock | None = None,
        heartbeat_timeout_s: float = 5.0,
        max_workers: int = 8,
        on_rank_lost: Callable[[str, int, float], None] | None = None,
        curve_keys: ServerKeys | None = None,
        client_keys: ClientKeys | None = None,
        trusted_networks: Sequence[str] = (),
        bind_device: str | None = None,
    ) -> None:
        if curve_keys is None and needs_auth(bind, trusted_networks):
            raise AuthRequired(
                f"the Opus service would bind {bind}, outside loopback and the run's own "
                "network, without authentication: make keys with `opus-testbed keys` and give "
                "them to the service (curve_keys), or bind 127.0.0.1")
        self.driver = driver
        self.curve_keys = curve_keys
        self.client_keys = client_keys
        self.trusted_networks = tuple(trusted_networks)
        self.bind_device = bind_device
        self._curve: CurveServer | None = None
        self.clock: Clock = clock or WallClock()
        rails = driver.describe()
        self.core = OpusCore(rails, config,
                             circuits=[c for r in rails if r.mode == "ocs"
                                       for c in driver.circuits(r.rail)])
        self.events = event_log or EventLog()
        self.heartbeat_timeout_s = heartbeat_timeout_s
        #: called (job, rank, t_s) from the service's thread when a rank's last session expires
        self.on_rank_lost = on_rank_lost
        self.controller_id = uuid.uuid4().hex[:12]
        self._bind = bind
        self._ctx = zmq.Context()
        self._router: zmq.Socket[bytes] | None = None
        self._wake_addr = f"inproc://opus-wake-{self.controller_id}"
        self._wake_push: zmq.Socket[bytes] | None = None
        self._wake_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="opus-ocs")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._draining = threading.Event()  # the loop stopped serving; switching may still end
        self._started = threading.Event()
        self._sessions: dict[str, _Session] = {}
        self._inflight = 0
        # predictions whose answer a shim waits for (the phase barrier under provisioning):
        # (identity, req, job, group, seq, rank), answered once core.call_ready holds
        self._ready_waits: list[tuple[bytes, object, str, str, int, int]] = []
        self._batcher = RailBatcher()  # decisions waiting for their rails, and in flight
        self.endpoint = ""
        #: the same socket in-process, for the artifact gateway (:mod:`controller.artifact_gateway`)
        self.inproc_endpoint = f"inproc://opus-service-{self.controller_id}"
        self.error: BaseException | None = None

    # --------------------------------------------------------------- life

    def start(self) -> ControllerService:
        """Bind and serve in a background thread; returns once the socket is bound."""
        router = self._ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if self.bind_device is not None:
            router.setsockopt(zmq.BINDTODEVICE, self.bind_device.encode())
        if self.curve_keys is not None:
            self._curve = CurveServer(self._ctx, self.curve_keys, self._refused)
            self._curve.secure(router)
        router.bind(self._bind)
        self.endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        router.bind(self.inproc_endpoint)
        self._router = router
        pull = self._ctx.socket(zmq.PULL)
        pull.bind(self._wake_addr)
        push = self._ctx.socket(zmq.PUSH)
        push.connect(self._wake_addr)
        self._wake_push = push
        self._thread = threading.Thread(target=self._loop, args=(router, pull),
                                        name="opus-controller", daemon=True)
        self._thread.start()
        self._started.wait()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving; waits for switching in progress, then closes sockets and the log."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._pool.shutdown(wait=True)
        with self._wake_lock:
            if self._wake_push is not None:
                self._wake_push.close(0)
                self._wake_push = None
        if self._curve is not None:
            self._curve.stop()
        self._ctx.term()
        self.events.close()

    @property
    def context(self) -> zmq.Context[Any]:
        """The service's ZeroMQ context (in-process clients must share it)."""
        return self._ctx

    def __enter__(self) -> ControllerService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def register_job(self, job: JobSpec, timeout_s: float = 5.0) -> None:
        """Register a job through the service's own protocol (same path as a remote client)."""
        with ControllerClient(self.endpoint, timeout_s=timeout_s,
                              curve=self.client_keys) as client:
            client.register_job(job)

    @property
    def clients_refused(self) -> int:
        """Handshakes refused by CURVE so far (every retry counted; the log is rate-limited)."""
        return self._curve.refused if self._curve is not None else 0

    def _refused(self, reason: str, peer: str) -> None:
        """A client refused by CURVE (called from the authenticator's threads)."""
        self.events.write([{"event": "client_refused", "t_s": self.clock.now(),
                            "peer": peer or None, "reason": reason}])

    # --------------------------------------------------------------- loop

    def _loop(self, router: zmq.Socket[bytes], pull: zmq.Socket[bytes]) -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(pull, zmq.POLLIN)
        self._started.set()
        next_check = time.monotonic() + 0.1
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(100))
                if pull in ready:
                    while True:
                        try:
                            item = pull.recv_pyobj(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._on_driver(item)
                if router in ready:
                    # read while the socket says a message waits (a zmq.Again per burst costs
                    # an exception on the ack path), at most 1000 before looking at the rest
                    for _ in range(1000):
                        if not int(router.get(zmq.EVENTS)) & zmq.POLLIN:
                            break
                        self._on_message(router.recv_multipart(zmq.NOBLOCK))
                now_mono = time.monotonic()
                if now_mono >= next_check:
                    next_check = now_mono + 0.1
                    self._expire_sessions(now_mono)
        except BaseException as exc:  # pragma: no cover - reported, never silent
            self.error = exc
            log.exception("controller loop crashed")
            raise
        finally:
            # let switching in progress finish so the driver is consistent, and log how it
            # ended (a run's verdict compares the controller's switch ends with the OCS app's
            # log: an end dropped here read as a switch the controller never saw), then close
            self._draining.set()
            deadline = time.monotonic() + 30
            while self._inflight and time.monotonic() < deadline:
                if pull.poll(100):
                    try:
                        self._on_driver(pull.recv_pyobj())
                    except Exception:  # pragma: no cover - reported; the drain goes on
                        log.exception("switch outcome during shutdown")
                        self._inflight = max(0, self._inflight - 1)
            router.close(0)
            pull.close(0)

    def _send(self, identity: bytes, msg: dict[str, Any]) -> None:
        assert self._router is not None
        try:
            self._router.send_multipart([identity, encode(msg)], zmq.NOBLOCK)
        except (zmq.Again, zmq.ZMQError) as exc:  # peer gone: nothing to deliver
            log.debug("reply to %r dropped: %s", identity, exc)

    def _emit(self, out: Output) -> None:
        now = self.clock.now()
        for ack in out.acks:
            assert isinstance(ack.ref, tuple)
            identity, req = ack.ref
            self._send(identity, {"type": "ack", "req": req, "group": ack.group_id,
                                  "seq": ack.seq, "reconfigured": ack.reconfigured, "t_s": now})
        for rej in out.rejects:
            if isinstance(rej.ref, tuple):
                rej_identity, rej_req = rej.ref
                self._send(rej_identity, {"type": "error", "req": rej_req, "code": rej.code,
                                      "message": rej.message})
        if self.events.wanted:  # (the core builds its events when they are read)
            self.events.write(out.events)
        for dec in out.decisions:
            self._start(self._batcher.submit(dec))
        if self._ready_waits:
            self._answer_ready()

    def _answer_ready(self) -> None:
        """Answer the waited predictions whose call may now run without waiting for its
        switch (``OpusCore.call_ready``, the simulator's test too)."""
        still = []
        for wait in self._ready_waits:
            identity, req, job_id, group, seq, rank = wait
            if self.core.call_ready(job_id, group, seq, rank):
                self._send(identity, {"type": "ready", "req": req, "group": group, "seq": seq})
            else:
                still.append(wait)
        self._ready_waits = still

    def _start(self, batches: list[Batch]) -> None:
        for batch in batches:
            self._inflight += 1
            self._pool.submit(self._run_batch, batch)

    def _run_batch(self, batch: Batch) -> None:
        """Worker thread: block in the driver, then post the outcome to the loop.

        The batcher starts a batch only when its rails are idle, and a rail's decisions in the
        order the core made them (:mod:`controller.batching`), so workers never race.
        """
        try:
            results = self.driver.apply_many(batch.reconfs)
            item: tuple[Any, ...] = ("done", batch.batch_id, [r.to_json() for r in results])
        except Exception as exc:  # any driver failure becomes a failed decision, never a hang
            item = ("failed", batch.batch_id, f"{type(exc).__name__}: {exc}")
        with self._wake_lock:
            if self._wake_push is not None:
                self._wake_push.send_pyobj(item)

    def _on_driver(self, item: tuple[Any, ...]) -> None:
        self._inflight -= 1
        kind, batch_id, payload = item
        now = self.clock.now()
        if kind == "done":
            batch, more = self._batcher.finished(batch_id)
            split = batch.split([ApplyResult.from_json(r) for r in payload])
            for dec in batch.decisions:
                self._emit(self.core.reconfig_done(dec.decision_id, split[dec.decision_id], now))
        else:  # the batch, and the waiting decisions planned on it, fail together
            batch, behind, more = self._batcher.failed(batch_id)
            self._emit(self.core.reconfigs_failed(
                [d.decision_id for d in batch.decisions], payload, now,
                withdrawn=[d.decision_id for d in behind]))
        self._start(more)

    def _error(self, identity: bytes, req: object, code: str, message: str) -> None:
        self._send(identity, {"type": "error", "req": req, "code": code, "message": message})
        self.events.write([{"event": "error", "t_s": self.clock.now(), "code": code,
                            "message": message}])

    def _on_message(self, frames: Sequence[bytes]) -> None:
        if len(frames) != 2:
            if frames:
                self._error(frames[0], None, "malformed", "expected exactly one message frame")
            return
        identity, data = frames
        req: object = None
        try:
            msg = decode(data)
            req = msg.get("req")
            self._dispatch(identity, msg, req)
        except ProtocolError as exc:
            self._error(identity, req, exc.code, str(exc))
        except Exception as exc:  # a bug must not stop the service for everyone else
            log.exception("error while handling %r", data[:200])
            self._error(identity, req, "internal", f"{type(exc).__name__}: {exc}")

    def _touch(self, msg: dict[str, Any]) -> None:
        shim = msg.get("shim")
        if isinstance(shim, str) and shim:
            job_id, rank = field_str(msg, "job"), field_int(msg, "rank")
            s = self._sessions.get(shim)
            if s is None:
                self._sessions[shim] = _Session(job_id, rank, time.monotonic())
                # a rank declared lost (no live session) shows up again: serve its groups again
                self._emit(self.core.rank_rejoined(job_id, rank, self.clock.now()))
            else:
                s.last_seen_s = time.monotonic()

    def _dispatch(self, identity: bytes, msg: dict[str, Any], req: object) -> None:
        kind = msg["type"]
        now = self.clock.now()
        if kind == "intent":
            intent = parse_intent(msg)
            field_int(msg, "req")
            self._touch(msg)
            self._emit(self.core.intent(intent, now, ref=(identity, req)))
        elif kind == "complete":
            job_id, rank = field_str(msg, "job"), field_int(msg, "rank")
            group, seq = field_str(msg, "group"), field_int(msg, "seq")
            nxt = parse_next(msg, job_id, rank)
            self._touch(msg)
            self._emit(self.core.complete(job_id, rank, group, seq, now, ref=(identity, req),
                                          next_intent=nxt))
        elif kind == "predict":
            intent = parse_intent(msg)
            self._touch(msg)
            if msg.get("answer"):  # the shim waits until the predicted call may run
                self._ready_waits.append((identity, req, intent.job_id, intent.group_id,
                                          intent.seq, intent.rank))
            self._emit(self.core.predict(intent, now))
            if self._ready_waits:
                self._answer_ready()
        elif kind == "heartbeat":
            self._touch(msg)
            self._send(identity, {"type": "heartbeat_ok", "controller": self.controller_id})
        elif kind == "hello":
            job_id, rank = field_str(msg, "job"), field_int(msg, "rank")
            spec = self.core.job(job_id)
            if spec is None:
                raise ProtocolError(f"no job {job_id!r} is registered with this controller",
                                    "unknown_job")
            if rank not in spec.ranks:
                raise ProtocolError(f"job {job_id} has no rank {rank}", "unknown_rank")
            self._touch(msg)
            rp = spec.ranks[rank]
            self._send(identity, {"type": "welcome", "req": req, "controller": self.controller_id,
                                  "rail": rp.rail, "ports": list(rp.ports)})
        elif kind == "bye":
            shim = msg.get("shim")
            if isinstance(shim, str):
                self._sessions.pop(shim, None)
        elif kind == "register":
            try:
                job = JobSpec.from_json(msg.get("job"))  # type: ignore[arg-type]
            except JobError as exc:
                raise ProtocolError(str(exc), "bad_job") from exc
            out = self.core.register_job(job, now, ref=(identity, req))
            if not out.rejects:
                self._send(identity, {"type": "registered", "req": req, "job": job.job_id})
            self._emit(out)
        elif kind == "unregister":
            job_id = field_str(msg, "job_id")
            out = self.core.unregister_job(job_id, now)
            # rejects with a ref go to the job's waiting ranks; one without is the refusal
            if all(r.ref is not None for r in out.rejects):
                self._send(identity, {"type": "unregistered", "req": req, "job": job_id})
            else:
                out.rejects[:] = [r if r.ref is not None else
                                  r.__class__((identity, req), r.code, r.message)
                                  for r in out.rejects]
            self._emit(out)
        elif kind == "ping":
            self._send(identity, {"type": "pong", "req": req, "controller": self.controller_id})
        elif kind == "stats":
            self._send(identity, {"type": "stats", "req": req,
                                  "counters": dict(self.core.counters)})
        else:
            raise ProtocolError(f"unknown message type {kind!r}", "unknown_type")

    def _expire_sessions(self, now_mono: float) -> None:
        dead = [k for k, s in self._sessions.items()
                if now_mono - s.last_seen_s > self.heartbeat_timeout_s]
        for key in dead:
            s = self._sessions.pop(key)
            alive = any(o.job_id == s.job_id and o.rank == s.rank for o in self._sessions.values())
            if not alive:
                now = self.clock.now()
                self._emit(self.core.rank_lost(s.job_id, s.rank, now))
                if self.on_rank_lost is not None:
                    self.on_rank_lost(s.job_id, s.rank, now)


class ControllerClient:
    """A small synchronous client for the runner: register jobs, read counters."""

    def __init__(self, endpoint: str, timeout_s: float = 5.0, *,
                 curve: ClientKeys | None = None) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        client_socket(self._sock, curve)
        self._sock.connect(endpoint)
        self._req = 0

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Send one request and wait for its reply; raises on timeout or an error reply."""
        from controller.shim import ControllerUnavailable, IntentRejected

        self._req += 1
        msg = {**msg, "req": self._req}
        self._sock.send(encode(msg))
        deadline = time.monotonic() + self.timeout_s
        while True:
            left_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
            if not self._sock.poll(left_ms):
                raise ControllerUnavailable(
                    f"no answer from the Opus controller at {self.endpoint} within "
                    f"{self.timeout_s} s to a {msg['type']!r} request")
            reply = decode(self._sock.recv())
            if reply.get("req") != self._req:
                continue
            if reply["type"] == "error":
                raise IntentRejected(str(reply.get("code")), str(reply.get("message")))
            return reply

    def register_job(self, job: JobSpec) -> None:
        self.request({"type": "register", "job": job.to_json()})

    def unregister_job(self, job_id: str) -> None:
        self.request({"type": "unregister", "job_id": job_id})

    def stats(self) -> dict[str, int]:
        counters = self.request({"type": "stats"})["counters"]
        assert isinstance(counters, dict)
        return counters

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
