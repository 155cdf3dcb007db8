"""A client of the Opus artifact's line protocol, written from the protocol
(:mod:`controller.artifact`), as the artifact's ``c10d`` shim speaks it.

:class:`ArtifactConnection` is one process's control connection (the artifact's shim keeps one
per process, shared by its communicators): it sends ``COMM`` and ``CONFIG_REQ`` lines, and a
reader thread sorts the answers by comm id. ``CONFIG_ACK`` carries only the comm id, so the
k-th ``CONFIG_ACK`` of a comm answers the k-th request on it from this connection.

:class:`ArtifactRank` gives a replayed rank (:mod:`testbed.emulated.replayer`) shims with the
interface of :class:`controller.shim.Shim` that speak this protocol instead of the project's
ZeroMQ one: it checks in every comm group of the rank at start (as ``torch.distributed`` creates
every process group at start), encodes each gated call as the artifact's shim does
(``encode_request``: a pipeline pair as backend ``1 + 10 * g`` and counter ``g * 1e6 + n``, a
data-parallel call as counter ``stage * 1e6 + n``) and waits for its ``CONFIG_ACK``. A
prediction (rail-state provisioning) sends the predicted call's request early, as the artifact's
provisioning does; the call itself then only waits for its answer. The protocol has no
completion message and no error reply: a refused request times out. With ``go_on_after_s`` (the
rail-state ``ocs.rail_state_ack_timeout_s``) a call goes on without an answer that has not come
that long after it began waiting, as the artifact's shim does after 10 s; the reader thread
counts the late ``CONFIG_ACK`` against its own request (never a later one's) and reports it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from controller.artifact import DP_BACKEND, comm_id, encode_request
from controller.job import JobSpec
from controller.shim import CollectiveGrant, ControllerUnavailable, LateAckHook, ShimError


class ArtifactConnection:
    """One TCP connection to a controller that speaks the artifact's protocol."""

    def __init__(self, host: str, port: int, *, source_ip: str | None = None,
                 connect_timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(
            (host, port), timeout=connect_timeout_s,
            source_address=(source_ip, 0) if source_ip else None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(None)
        self._lock = threading.Condition()
        self._send_lock = threading.Lock()
        self.domains: dict[str, int] = {}  # comm -> domain from its CHECKIN_ACK
        self.asked: dict[str, int] = {}  # comm -> requests sent
        self.acked: dict[str, int] = {}  # comm -> CONFIG_ACKs received
        self.ack_times: dict[str, list[float]] = {}  # comm -> time.time() of each CONFIG_ACK
        self.other: list[str] = []  # lines that are neither
        # (comm, ticket) -> called with the time its CONFIG_ACK came (a request gone on without)
        self._watch: dict[tuple[str, int], Callable[[float], None]] = {}
        self.closed = False
        self._reader = threading.Thread(target=self._read, daemon=True, name="artifact-reader")
        self._reader.start()

    def send_line(self, line: str | bytes) -> None:
        """Send raw bytes (tests send malformed lines with it)."""
        data = line.encode() if isinstance(line, str) else line
        with self._send_lock:
            self.sock.sendall(data)

    def checkin(self, comm: str, nranks: int, local_rank: int) -> None:
        self.send_line(f"COMM;{comm},{nranks},{local_rank}\n")

    def request(self, comm: str, backend: int, counter: int) -> int:
        """Send a ``CONFIG_REQ``; returns its ticket for :meth:`wait_ack`."""
        with self._lock:
            ticket = self.asked.get(comm, 0)
            self.asked[comm] = ticket + 1
        self.send_line(f"CONFIG_REQ;{comm},{backend},{counter}\n")
        return ticket

    def wait_checkin(self, comm: str, timeout_s: float) -> int:
        """The comm's domain, once its ``CHECKIN_ACK`` came."""
        with self._lock:
            if not self._lock.wait_for(lambda: comm in self.domains or self.closed, timeout_s):
                raise ControllerUnavailable(f"no CHECKIN_ACK for comm {comm[:16]} within "
                                            f"{timeout_s} s")
            if comm not in self.domains:
                raise ControllerUnavailable("the controller closed the connection")
            return self.domains[comm]

    def wait_ack(self, comm: str, ticket: int, timeout_s: float,
                 cancelled: threading.Event | None = None,
                 go_on_after_s: float | None = None) -> float | None:
        """Wait for the ``CONFIG_ACK`` that answers request ``ticket`` of ``comm``; returns
        when it came (``time.time()``), or None once ``go_on_after_s`` passed without it."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        go_on = t0 + go_on_after_s if go_on_after_s is not None else float("inf")
        with self._lock:
            while self.acked.get(comm, 0) <= ticket:
                now = time.monotonic()
                left = min(deadline, go_on) - now
                if self.closed:
                    raise ControllerUnavailable("the controller closed the connection")
                if cancelled is not None and cancelled.is_set():
                    raise ShimError(f"cancelled while waiting for CONFIG_ACK of {comm[:16]}")
                if now >= go_on:
                    return None
                if left <= 0:
                    raise ControllerUnavailable(
                        f"no CONFIG_ACK for comm {comm[:16]} request {ticket} within "
                        f"{timeout_s} s")
                self._lock.wait(min(left, 0.25))
            return self.ack_times[comm][ticket]

    def watch(self, comm: str, ticket: int, hook: Callable[[float], None]) -> None:
        """Call ``hook`` with the time the ``CONFIG_ACK`` of request ``ticket`` of ``comm``
        comes (at once if it came already): a request the rank went on without."""
        with self._lock:
            if self.acked.get(comm, 0) <= ticket:
                self._watch[(comm, ticket)] = hook
                return
            t = self.ack_times[comm][ticket]
        hook(t)

    def _read(self) -> None:
        buf = b""
        try:
            while True:
                data = self.sock.recv(4096)
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    raw, buf = buf.split(b"\n", 1)
                    self._on_line(raw.decode("ascii", "replace"), time.time())
        except OSError:
            pass
        finally:
            with self._lock:
                self.closed = True
                self._lock.notify_all()

    def _on_line(self, line: str, t: float) -> None:
        header, _, body = line.partition(";")
        hook: Callable[[float], None] | None = None
        with self._lock:
            if header == "CHECKIN_ACK":
                comm, _, domain = body.partition(",")
                self.domains[comm] = int(domain)
            elif header == "CONFIG_ACK":
                ticket = self.acked.get(body, 0)
                self.acked[body] = ticket + 1
                self.ack_times.setdefault(body, []).append(t)
                hook = self._watch.pop((body, ticket), None)
            else:
                self.other.append(line)
            self._lock.notify_all()
        if header == "CONFIG_ACK" and hook is not None:
            hook(t)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._reader.join(2.0)


@dataclass(frozen=True)
class CommPlan:
    """How a rank speaks of one comm group: its comm id, size, and request encoding."""

    comm: str
    nranks: int
    pp_stage: int | None  # a pipeline pair: its higher stage; else None
    stage: int  # the group's first pipeline stage (data-parallel counters)

    def to_json(self) -> dict[str, Any]:
        return {"comm": self.comm, "nranks": self.nranks, "pp_stage": self.pp_stage,
                "stage": self.stage}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CommPlan:
        pp = data.get("pp_stage")
        return cls(str(data["comm"]), int(data["nranks"]), None if pp is None else int(pp),
                   int(data["stage"]))


def rank_comms(job: JobSpec, rank: int) -> dict[str, CommPlan]:
    """The comm plan of every group ``rank`` is in, by group id: a ``pp`` pairs group of two
    ranks in adjacent stages is a pipeline pair; every other group asks as data-parallel, its
    counter carrying its first stage (a pipeline ring spans several)."""
    stages = job.stages or {}
    out = {}
    for g in job.groups.values():
        if rank not in g.ranks:
            continue
        member_stages = sorted({stages.get(r, 0) for r in g.ranks})
        pair = g.axis == "pp" and (g.kind == "pairs" or g.pairs is not None)
        pp = (member_stages[1] if pair and len(g.ranks) == 2 and len(member_stages) == 2
              and member_stages[1] == member_stages[0] + 1 else None)
        out[g.group_id] = CommPlan(comm_id(job.job_id, g.group_id), len(g.ranks), pp,
                                   member_stages[0])
    return out


class ArtifactRank:
    """One replayed rank's side of the artifact's protocol: its connection and its comms."""

    def __init__(self, host: str, port: int, local_rank: int, comms: Mapping[str, CommPlan],
                 *, ack_timeout_s: float = 60.0, job_id: str = "",
                 seqs: dict[str, int] | None = None, source_ip: str | None = None,
                 go_on_after_s: float | None = None,
                 on_late_ack: LateAckHook | None = None) -> None:
        self.host, self.port = host, port
        self.source_ip = source_ip
        self.local_rank = local_rank
        self.comms = dict(comms)
        self.ack_timeout_s = ack_timeout_s
        self.go_on_after_s = go_on_after_s  # a call goes on without its answer after this
        self.on_late_ack = on_late_ack
        self.job_id = job_id
        self.seqs: dict[str, int] = seqs if seqs is not None else {}
        self._conn: ArtifactConnection | None = None
        self._tickets: dict[tuple[str, int], int] = {}  # (group, seq) -> ticket
        self._done: dict[str, int] = {}  # group -> its last call answered
        self._lock = threading.Lock()
        self.cancelled = threading.Event()

    def connection(self) -> ArtifactConnection:
        """Connect and check in every comm (once)."""
        with self._lock:
            if self._conn is None:
                conn = ArtifactConnection(self.host, self.port, source_ip=self.source_ip)
                for plan in self.comms.values():
                    conn.checkin(plan.comm, plan.nranks, self.local_rank)
                self._conn = conn
            return self._conn

    def ask(self, group: str, seq: int, early: bool = False) -> int | None:
        """Send call ``seq`` of ``group``'s request unless it was sent; returns its ticket.
        An ``early`` request (a prediction) for a call already answered is not sent (None)."""
        plan = self.comms.get(group)
        if plan is None:
            raise ShimError(f"rank with local rank {self.local_rank} is not in group {group!r}")
        conn = self.connection()
        with self._lock:
            ticket = self._tickets.get((group, seq))
            if ticket is not None or (early and seq <= self._done.get(group, -1)):
                return ticket
        conn.wait_checkin(plan.comm, self.ack_timeout_s)
        backend, counter = encode_request(
            plan.pp_stage is not None,
            plan.pp_stage if plan.pp_stage is not None else plan.stage, seq, DP_BACKEND)
        with self._lock:
            ticket = self._tickets.get((group, seq))
            if early and seq <= self._done.get(group, -1):
                return ticket
            if ticket is None:
                ticket = self._tickets[(group, seq)] = conn.request(plan.comm, backend, counter)
            return ticket

    def wait(self, group: str, seq: int, ticket: int) -> bool:
        """Wait for call ``seq`` of ``group``'s answer: True when it came, False when the call
        goes on without it (``go_on_after_s``; its late answer is reported to
        ``on_late_ack``)."""
        plan = self.comms[group]
        conn = self.connection()
        t = conn.wait_ack(plan.comm, ticket, self.ack_timeout_s, self.cancelled,
                          self.go_on_after_s)
        with self._lock:
            self._tickets.pop((group, seq), None)
            self._done[group] = max(self._done.get(group, -1), seq)
        if t is None and self.on_late_ack is not None:
            hook = self.on_late_ack
            conn.watch(plan.comm, ticket, lambda t_late: hook(group, seq, False, t_late))
        return t is not None

    def shim(self) -> ArtifactShim:
        return ArtifactShim(self)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class ArtifactShim:
    """A lane's shim over :class:`ArtifactRank`, with :class:`controller.shim.Shim`'s
    interface as the replayer uses it (no failover: :meth:`retarget` refuses)."""

    def __init__(self, rank: ArtifactRank) -> None:
        self.owner = rank
        self.job_id = rank.job_id

    def connect(self) -> None:
        self.owner.connection()

    def mark_iteration(self) -> None:
        """Nothing to do: the artifact's shim profiles nothing."""

    @contextlib.contextmanager
    def collective(self, group: str, kind: str = "", size_bytes: int = 0, axis: str = "",
                   gated: bool = True) -> Iterator[CollectiveGrant]:
        seqs = self.owner.seqs
        seq = seqs.get(group, 0)
        seqs[group] = seq + 1
        if not gated:
            yield CollectiveGrant(group, seq, False, 0.0)
            return
        t0 = time.monotonic()
        try:
            ticket = self.owner.ask(group, seq)
            assert ticket is not None
            answered = self.owner.wait(group, seq, ticket)
        except ShimError:
            seqs[group] = seq
            raise
        except OSError as exc:
            seqs[group] = seq
            raise ControllerUnavailable(f"artifact protocol connection failed: {exc}") from exc
        # the protocol does not say whether the circuits had to switch
        yield CollectiveGrant(group, seq, False, time.monotonic() - t0,
                              timed_out=not answered)

    def predict(self, group: str, seq: int, kind: str = "", size_bytes: int = 0,
                axis: str = "", wait: bool = False) -> None:
        """Ask for a later call now (the artifact's provisioning request); a call its lane has
        already reached asks (or asked) for itself. (A request the controller refuses gets no
        answer, and ``CONFIG_ACK`` s are matched to requests in order, so none is sent in
        vain.) With ``wait``, return once that request is answered (the artifact's
        ``topoprovision`` blocks so), at once for a call already answered."""
        if seq < self.owner.seqs.get(group, 0) and not wait:
            return
        ticket = self.owner.ask(group, seq, early=True)
        if wait and ticket is not None:
            plan = self.owner.comms[group]
            self.owner.connection().wait_ack(plan.comm, ticket, self.owner.ack_timeout_s,
                                             self.owner.cancelled)

    def retarget(self, job_id: str, seqs: dict[str, int] | None = None) -> None:
        raise ShimError("the artifact's protocol has no failover: a job cannot be retargeted")

    def cancel(self) -> None:
        self.owner.cancelled.set()

    def close(self) -> None:
        """The rank's connection closes with :meth:`ArtifactRank.close`."""
