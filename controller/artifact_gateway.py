"""Serve the Opus artifact's line protocol (:mod:`controller.artifact`) beside the service.

:class:`ArtifactGateway` listens on TCP for the artifact's shims and speaks the service's own
protocol to it (:mod:`controller.protocol`) over an in-process ZeroMQ socket: each rank that
checks in gets a shim session (hello, heartbeats while its connection is open, bye when it
closes), each mapped ``CONFIG_REQ`` becomes an ``intent`` and its ``ack`` becomes the
``CONFIG_ACK`` line. So the core, its switching model, its decisions, its event log and the OCS
log are exactly those of a run with the testbed's own shims, and a ``CONFIG_ACK`` leaves only
when the core acknowledges, i.e. after the light.

The artifact's protocol says nothing when a call ends. A rank's calls count as complete when
the rank sends its next ``CONFIG_REQ`` (on any comm) and when its connection closes: the
artifact's shim asks for a new phase only once the previous phase's last call has ended (its
``topo_ready`` barrier), so this is when its previous circuits may go.

A call whose switch failed (``reconfig_failed``) is asked for again, up to
:data:`controller.protocol.CALL_RETRIES` times, as the replayer's own shim does; the artifact's
protocol has no error reply for its shim to act on. A line that is malformed or cannot be mapped is
answered by nothing, logged (``log`` warning, an ``artifact_refused`` event in the service's event
log, :attr:`ArtifactGateway.refused`) and changes nothing; the gateway keeps serving every
connection. The protocol has no authentication: :func:`controller.artifact.check_listen_host`
refuses any address but loopback or one the caller names as trusted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import zmq

from controller.artifact import (
    DEFAULT_PORT,
    MAX_LINE_BYTES,
    ArtifactBook,
    ArtifactError,
    CommLine,
    ServerMap,
    check_listen_host,
    config_ack,
    parse_line,
)
from controller.job import JobSpec
from controller.protocol import encode, may_retry

if TYPE_CHECKING:
    from controller.service import ControllerService

log = logging.getLogger(__name__)

#: how many refusals :attr:`ArtifactGateway.refused` keeps (the event log keeps them all)
KEEP_REFUSED = 1000


@dataclass
class _Conn:
    conn_id: int
    sock: socket.socket
    peer: str
    buf: bytearray = field(default_factory=bytearray)
    skipping: bool = False  # dropping the rest of a line that was too long
    sessions: dict[int, str] = field(default_factory=dict)  # rank -> shim session
    closed: bool = False


@dataclass(frozen=True)
class _Pending:
    conn_id: int
    comm: str
    rank: int
    session: str
    group: str
    seq: int
    axis: str = ""
    retries: int = 0


class ArtifactGateway:
    """The artifact's protocol on ``host:port`` (port 0 picks a free one) for ``job``, whose
    ranks sit ``gpus_per_server`` to a server listed in ``server_ips`` (``SERVER_IPS``: one
    address, or a list of addresses, per server). Start it after the service."""

    def __init__(self, service: ControllerService, job: JobSpec, *,
                 server_ips: Sequence[str | Sequence[str]], gpus_per_server: int,
                 host: str = "127.0.0.1", port: int = DEFAULT_PORT, trusted: Iterable[str] = (),
                 heartbeat_interval_s: float = 0.5) -> None:
        self.host = check_listen_host(host, trusted)
        self.port = port
        self.service = service
        self.job = job
        self.book = ArtifactBook(job, ServerMap(server_ips), gpus_per_server)
        self.heartbeat_interval_s = heartbeat_interval_s
        #: the latest refusals: {t_s, peer, code, reason, line}
        self.refused: list[dict[str, Any]] = []
        #: CONFIG_ACK lines sent, and requests mapped to intents (for tests and summaries)
        self.counters = {"lines": 0, "checkins": 0, "requests": 0, "config_acks": 0,
                         "refused": 0, "connections": 0, "retries": 0}
        self._listener: socket.socket | None = None
        self._dealer: zmq.Socket[bytes] | None = None
        self._conns: dict[int, _Conn] = {}
        self._by_fd: dict[int, _Conn] = {}
        self._pending: dict[int, _Pending] = {}
        self._open: dict[int, list[tuple[str, str, int]]] = {}  # rank -> (session, group, seq)
        self._req = 0
        self._next_conn = 0
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    # ------------------------------------------------------------------------ life

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> ArtifactGateway:
        """Bind, connect to the service in-process, serve in a thread; returns once bound."""
        lsock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET,
                              socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            lsock.bind((self.host, self.port))
            lsock.listen(128)
        except OSError:
            lsock.close()
            raise
        self.port = int(lsock.getsockname()[1])
        self._listener = lsock
        dealer = self.service.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.service.inproc_endpoint)
        self._dealer = dealer
        self._thread = threading.Thread(target=self._loop, name="opus-artifact", daemon=True)
        self._thread.start()
        self._started.wait()
        log.info("artifact protocol on %s (no authentication: loopback or a trusted interface)",
                 self.address)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close every connection (their calls complete, their sessions end) and stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> ArtifactGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------ loop

    def _loop(self) -> None:
        assert self._listener is not None and self._dealer is not None
        listener, dealer = self._listener, self._dealer
        poller = zmq.Poller()
        poller.register(listener.fileno(), zmq.POLLIN)
        poller.register(dealer, zmq.POLLIN)
        self._started.set()
        next_beat = time.monotonic()
        try:
            while not self._stop.is_set():
                for item, _ev in poller.poll(50):
                    if item is dealer:
                        self._drain(dealer)
                    elif item == listener.fileno():
                        self._accept(poller)
                    elif isinstance(item, int) and item in self._by_fd:
                        self._read(poller, self._by_fd[item])
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + self.heartbeat_interval_s
                    self._heartbeats()
        except BaseException as exc:  # pragma: no cover - reported, never silent
            self.error = exc
            log.exception("artifact gateway crashed")
            raise
        finally:
            for conn in list(self._conns.values()):
                self._close(poller, conn)
            self._drain(dealer)
            listener.close()
            dealer.close(linger=500)

    def _send_service(self, msg: dict[str, Any]) -> None:
        assert self._dealer is not None
        try:
            self._dealer.send(encode(msg), zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the service is gone: nothing to deliver
            log.debug("message to the service dropped: %s", exc)

    def _accept(self, poller: zmq.Poller) -> None:
        assert self._listener is not None
        try:
            sock, addr = self._listener.accept()
        except OSError:
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(2.0)  # reads only when ready; a reply that cannot leave in 2 s closes
        self._next_conn += 1
        conn = _Conn(self._next_conn, sock, str(addr[0]))
        self._conns[conn.conn_id] = conn
        self._by_fd[sock.fileno()] = conn
        poller.register(sock.fileno(), zmq.POLLIN)
        self.counters["connections"] += 1

    def _read(self, poller: zmq.Poller, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (OSError, TimeoutError):
            data = b""
        if not data:
            self._close(poller, conn)
            return
        conn.buf += data
        while True:
            cut = conn.buf.find(b"\n")
            if cut < 0:
                if len(conn.buf) > MAX_LINE_BYTES and not conn.skipping:
                    self._refuse(conn, bytes(conn.buf[:200]), ArtifactError(
                        f"a line longer than {MAX_LINE_BYTES} bytes"))
                    conn.skipping = True
                if conn.skipping:
                    conn.buf.clear()
                return
            raw = bytes(conn.buf[:cut])
            del conn.buf[:cut + 1]
            if conn.skipping:  # the end of the overlong line
                conn.skipping = False
                continue
            self._line(conn, raw)
            if conn.closed:
                return

    def _line(self, conn: _Conn, raw: bytes) -> None:
        self.counters["lines"] += 1
        try:
            if len(raw) > MAX_LINE_BYTES:
                raise ArtifactError(f"a line longer than {MAX_LINE_BYTES} bytes")
            try:
                text = raw.decode("ascii")
            except UnicodeDecodeError as exc:
                raise ArtifactError("a line that is not ASCII") from exc
            parsed = parse_line(text)
            if parsed is None:
                return
            if isinstance(parsed, CommLine):
                self._checkin(conn, parsed)
            else:
                req = self.book.on_config_req(conn.conn_id, parsed)
                self._request(conn, req.comm, req.intent.rank, req.intent.group_id,
                              req.intent.seq, req.intent.axis)
        except ArtifactError as exc:
            self._refuse(conn, raw, exc)
        except Exception as exc:  # a bug must not stop the gateway for everyone else
            log.exception("error while handling %r from %s", raw[:200], conn.peer)
            self._refuse(conn, raw, ArtifactError(f"{type(exc).__name__}: {exc}", "internal"))

    def _checkin(self, conn: _Conn, line: CommLine) -> None:
        rank = self.book.rank_of(conn.peer, line.local_rank)
        acks = self.book.on_comm(conn.conn_id, conn.peer, line)
        self.counters["checkins"] += 1
        if rank not in conn.sessions:
            session = conn.sessions[rank] = uuid.uuid4().hex
            self._req += 1
            self._send_service({"type": "hello", "job": self.job.job_id, "rank": rank,
                                "shim": session, "req": self._req})
        for conn_id, data in acks:
            target = self._conns.get(conn_id)
            if target is not None:
                self._write(target, data)

    def _request(self, conn: _Conn, comm: str, rank: int, group: str, seq: int,
                 axis: str) -> None:
        session = conn.sessions[rank]
        job = self.job.job_id
        for old_session, old_group, old_seq in self._open.pop(rank, []):
            self._send_service({"type": "complete", "job": job, "rank": rank,
                                "shim": old_session, "group": old_group, "seq": old_seq,
                                "next": None})
        self.counters["requests"] += 1
        self._intent(_Pending(conn.conn_id, comm, rank, session, group, seq, axis))

    def _intent(self, p: _Pending) -> None:
        self._req += 1
        self._pending[self._req] = p
        self._send_service({"type": "intent", "job": self.job.job_id, "rank": p.rank,
                            "shim": p.session, "req": self._req, "group": p.group,
                            "seq": p.seq, "kind": "", "size_bytes": 0, "axis": p.axis})

    def _drain(self, dealer: zmq.Socket[bytes]) -> None:
        while True:
            try:
                data = dealer.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            try:
                reply = json.loads(data)
            except ValueError:
                continue
            if isinstance(reply, dict):
                self._reply(reply)

    def _reply(self, reply: dict[str, Any]) -> None:
        kind = reply.get("type")
        req = reply.get("req")
        pending = self._pending.pop(req, None) if isinstance(req, int) else None
        if kind == "ack" and pending is not None:
            conn = self._conns.get(pending.conn_id)
            if conn is None or conn.closed:  # its process went: the call ends here
                self._send_service({"type": "complete", "job": self.job.job_id,
                                    "rank": pending.rank, "shim": pending.session,
                                    "group": pending.group, "seq": pending.seq, "next": None})
                return
            self._open.setdefault(pending.rank, []).append(
                (pending.session, pending.group, pending.seq))
            self.counters["config_acks"] += 1
            self._write(conn, config_ack(pending.comm))
        elif kind == "error":
            code, message = str(reply.get("code")), str(reply.get("message"))
            # the gateway asks again for the artifact's shim, as the replayer's own shim does
            # (:func:`controller.protocol.may_retry`): the artifact's protocol has no error reply
            if pending is not None and may_retry(code, pending.retries) and \
                    pending.conn_id in self._conns:
                log.warning("artifact protocol: rank %d group %s call %d: %s; asking again",
                            pending.rank, pending.group, pending.seq, message)
                self.counters["retries"] += 1
                self._intent(replace(pending, retries=pending.retries + 1))
                return
            where = (f"rank {pending.rank} group {pending.group} call {pending.seq}"
                     if pending is not None else "a session message")
            peer = self._conns[pending.conn_id].peer if pending is not None and \
                pending.conn_id in self._conns else ""
            self._note(peer, code, f"the controller refused {where}: {message}", "")

    def _heartbeats(self) -> None:
        job = self.job.job_id
        for conn in self._conns.values():
            for rank, session in conn.sessions.items():
                self._send_service({"type": "heartbeat", "job": job, "rank": rank,
                                    "shim": session})

    def _write(self, conn: _Conn, data: bytes) -> None:
        try:
            conn.sock.sendall(data)
        except (OSError, TimeoutError) as exc:
            log.warning("artifact client %s: reply not delivered (%s); closing", conn.peer, exc)
            with contextlib.suppress(OSError):  # the poller then reads its end and closes it
                conn.sock.shutdown(socket.SHUT_RDWR)

    def _close(self, poller: zmq.Poller, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        fd = conn.sock.fileno()
        if fd >= 0:
            poller.unregister(fd)
            self._by_fd.pop(fd, None)
        conn.sock.close()
        self._conns.pop(conn.conn_id, None)
        self.book.drop(conn.conn_id)
        job = self.job.job_id
        for rank, session in conn.sessions.items():
            still = [c for c in self._open.get(rank, []) if c[0] != session]
            for _s, group, seq in [c for c in self._open.get(rank, []) if c[0] == session]:
                self._send_service({"type": "complete", "job": job, "rank": rank,
                                    "shim": session, "group": group, "seq": seq, "next": None})
            if still:
                self._open[rank] = still
            else:
                self._open.pop(rank, None)
            self._send_service({"type": "bye", "shim": session})

    def _refuse(self, conn: _Conn, raw: bytes, exc: ArtifactError) -> None:
        self._note(conn.peer, exc.code, str(exc), raw[:200].decode("ascii", "replace"))

    def _note(self, peer: str, code: str, reason: str, line: str) -> None:
        self.counters["refused"] += 1
        record = {"event": "artifact_refused", "t_s": self.service.clock.now(), "peer": peer,
                  "code": code, "reason": reason, "line": line}
        log.warning("artifact protocol: %s from %s refused (%s): %s", line or "a request",
                    peer or "?", code, reason)
        self.refused.append(record)
        del self.refused[:-KEEP_REFUSED]
        self.service.events.write([record])
