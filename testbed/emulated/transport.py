"""The rank-to-rank TCP transport of a collective call, shared by the replayer and torch jobs.

A call opens one connection per peer it sends to, after Opus acknowledged it (the circuits are
lit), and closes it before the call completes, so nothing is open across a switch. The sender
introduces the connection with a JSON line (``it``, ``cid``, ``src``) and sends each algorithm
step as a 12-byte header (step, length) plus payload. The receiving rank's :class:`Listener`
drains every incoming connection into its :class:`Inbox`, keyed by (iteration, call id, sender,
step): sends are eager, so a receiver never has to be waiting for them. A sender finishes by
shutting its side down and waiting for the receiver's EOF: the bytes have then been read by the
peer, not only queued.

A ``sync`` step (collective algorithms whose one-way rounds must not run ahead,
:mod:`workloads.algorithms`) is a rendezvous instead, as NCCL's sends wait for the matching
receive: the receiver tells the sender on the sender's connection that it has reached the step
(:meth:`Inbox.ready`, a ``READY_FLAG`` header), the sender sends only then with ``SYNC_FLAG`` in
the step's header, and waits (:meth:`Outgoing.expect`) until the receiver answers ``SYNC_FLAG``
once it has read the payload.

Two sinks: a counting inbox (the replayer's filler bytes: only their number matters) and a
payload inbox (``keep_payload``: a torch job's tensors, handed to the receiving call whole).
A listener may route each connection by its hello (:data:`Route`): the replayer's epochs of a
failover run each have their own inbox, and a connection of an abandoned epoch is dropped.
An :data:`Address` is a (host, port) pair for TCP or the path of a Unix socket: pathname Unix
sockets work across network namespaces, so the GPUs of one server exchange their scale-up
(NVLink) traffic through them, never through a rail or the frontend.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

STEP_HEADER = struct.Struct("!IQ")  # step index, payload bytes
# Flags in the step index of a header (sync steps, above).
SYNC_FLAG = 1 << 31
READY_FLAG = 1 << 30
FLAGS = SYNC_FLAG | READY_FLAG
FILLER = bytes(range(256)) * 1024  # 256 KiB of filler, sent in slices when there is no payload
POLL_S = 0.25
#: A receiving thread wakes when this many bytes of a step (or the step's rest) are queued,
#: not at every segment (``SO_RCVLOWAT``): at a few Mbit/s a segment comes every ~2 ms, and
#: one wake-up each cost ~20 us of CPU per segment in the receiver and again in the lane
#: waiting for the step. The last bytes of a step still wake it at once.
RECV_WAKE_BYTES = 1 << 16

#: (iteration, call id, sender rank, step)
Key = tuple[int, str, int, int]
#: (iteration, call id, sender rank): one incoming connection
Origin = tuple[int, str, int]
#: (host, TCP port), or the path of a Unix socket
Address = tuple[str, int] | str


def _socket(address: Address) -> socket.socket:
    if isinstance(address, str):
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def address_text(address: Address) -> str:
    return address if isinstance(address, str) else f"{address[0]}:{address[1]}"


class TransportError(RuntimeError):
    """A transfer could not complete (peer silent, short read, connection refused)."""


class Abort(Exception):
    """Another lane of the rank failed (or the run moved on to a new epoch); this one stops."""


class Inbox:
    """Bytes received per (iteration, call id, sender, step), with waiting; the open incoming
    connections, so a sync step's receiver can answer on them. A counting inbox also keeps the
    bytes of connections whose hello asks so (``keep``: the replayer's verify plans)."""

    def __init__(self, *, keep_payload: bool = False) -> None:
        self.keep_payload = keep_payload
        self._cv = threading.Condition()
        self._got: dict[Key, int] = {}
        self._data: dict[Key, bytearray] = {}
        self._conns: dict[Origin, tuple[socket.socket, threading.Lock]] = {}
        self.errors: list[str] = []

    def post(self, key: Key, chunk: memoryview | bytes, keep: bool = False) -> None:
        with self._cv:
            self._got[key] = self._got.get(key, 0) + len(chunk)
            if keep or self.keep_payload:
                self._data.setdefault(key, bytearray()).extend(chunk)
            self._cv.notify_all()

    def register(self, origin: Origin, conn: socket.socket) -> threading.Lock:
        """An incoming connection from ``origin`` is open; returns the lock that serialises
        what this rank writes on it."""
        lock = threading.Lock()
        with self._cv:
            self._conns[origin] = (conn, lock)
            self._cv.notify_all()
        return lock

    def unregister(self, origin: Origin, conn: socket.socket) -> None:
        with self._cv:
            if self._conns.get(origin, (None,))[0] is conn:
                del self._conns[origin]

    def ready(self, origin: Origin, step: int, timeout_s: float,
              aborted: threading.Event) -> None:
        """Tell the sender of ``origin`` that this rank has reached sync step ``step``: wait
        for its connection, then answer on it."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while origin not in self._conns:
                if aborted.is_set():
                    raise Abort
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportError(f"rank {origin[2]} did not connect for {origin[1]} "
                                         f"step {step} (iteration {origin[0]}) within "
                                         f"{timeout_s:.0f} s")
                self._cv.wait(min(left, POLL_S))
            conn, lock = self._conns[origin]
        with lock:
            conn.sendall(STEP_HEADER.pack(step | READY_FLAG, 0))

    def fail(self, message: str) -> None:
        with self._cv:
            self.errors.append(message)
            self._cv.notify_all()

    def wake(self) -> None:
        """Wake every waiter (they then see their abort event)."""
        with self._cv:
            self._cv.notify_all()

    def wait(self, key: Key, expected: int, timeout_s: float, aborted: threading.Event) -> int:
        """Wait until ``expected`` bytes of ``key`` arrived; returns how many did."""
        with self._cv:
            self._await(key, expected, timeout_s, aborted)
            self._data.pop(key, None)
            return self._got.pop(key)

    def take(self, key: Key, expected: int, timeout_s: float,
             aborted: threading.Event) -> bytearray:
        """The ``expected`` bytes of ``key`` (a payload inbox), once they all arrived."""
        with self._cv:
            self._await(key, expected, timeout_s, aborted)
            got = self._got.pop(key)
            data = self._data.pop(key, bytearray())
            if got != expected:
                raise TransportError(f"received {got} bytes from rank {key[2]} for {key[1]} "
                                     f"step {key[3]}, expected {expected}")
            return data

    def _await(self, key: Key, expected: int, timeout_s: float,
               aborted: threading.Event) -> None:
        deadline = time.monotonic() + timeout_s
        while self._got.get(key, -1 if expected == 0 else 0) < expected:
            if aborted.is_set():
                raise Abort
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportError(
                    f"received {max(0, self._got.get(key, 0))} of {expected} bytes from rank "
                    f"{key[2]} for {key[1]} step {key[3]} (iteration {key[0]}) within "
                    f"{timeout_s:.0f} s")
            self._cv.wait(min(left, POLL_S))


def recv_exact(conn: socket.socket, n: int) -> bytes:
    """Up to ``n`` bytes from ``conn``: fewer only when the peer closed first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


class _WakeThreshold:
    """Sets a socket's ``SO_RCVLOWAT`` (bytes queued before a read wakes), skipping repeats."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.value = 1  # the kernel's default

    def set(self, nbytes: int) -> None:
        nbytes = max(1, min(nbytes, RECV_WAKE_BYTES))
        if nbytes != self.value:
            self.conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
            self.value = nbytes


#: an incoming connection's hello -> the inbox its bytes go to (None: drop the connection)
Route = Callable[[dict[str, Any]], Inbox | None]
#: forwards a connection whose hello names further stations (``via``; testbed.emulated.relay)
Forward = Callable[[socket.socket, dict[str, Any]], None]


def serve_connection(conn: socket.socket, inbox: Inbox | Route, io_timeout_s: float,
                     forward: Forward | None = None) -> None:
    """Drain one incoming connection into ``inbox`` (or the one its hello is routed to); close
    it at the sender's EOF. A hello with ``via`` goes to ``forward`` instead (a relay)."""
    sink: Inbox | None = inbox if isinstance(inbox, Inbox) else None
    wake = _WakeThreshold(conn)
    with conn:
        try:
            conn.settimeout(io_timeout_s)
            if conn.family != socket.AF_UNIX:
                # this side answers sync steps with small headers: without NODELAY, Nagle's
                # algorithm holds each behind the ack of the previous one (up to 40 ms)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            line = bytearray()
            while not line.endswith(b"\n"):
                ch = conn.recv(1)
                if not ch:
                    return
                line += ch
            hello = json.loads(line)
            if hello.get("via") and forward is not None:
                forward(conn, hello)
                return
            origin = (int(hello["it"]), str(hello["cid"]), int(hello["src"]))
            if sink is None:
                assert not isinstance(inbox, Inbox)
                sink = inbox(hello)
                if sink is None:
                    return  # a connection nobody waits for (an abandoned epoch's)
            lock = sink.register(origin, conn)
            try:
                _drain(conn, sink, origin, bool(hello.get("keep")), lock, wake)
            finally:
                sink.unregister(origin, conn)
        except (OSError, ValueError, KeyError, TransportError) as exc:
            if sink is not None:
                sink.fail(f"incoming connection: {type(exc).__name__}: {exc}")


def _drain(conn: socket.socket, inbox: Inbox, origin: Origin, keep: bool,
           lock: threading.Lock, wake: _WakeThreshold) -> None:
    """Read steps until EOF; keep their bytes if asked; answer the sync steps once read."""
    it, cid, src = origin
    view = memoryview(bytearray(1 << 18))
    while True:
        wake.set(STEP_HEADER.size)
        head = recv_exact(conn, STEP_HEADER.size)
        if not head:
            return  # EOF: the sender is done; closing tells it we read everything
        if len(head) < STEP_HEADER.size:
            raise TransportError(f"truncated step header from rank {src} for {cid}")
        flagged, length = STEP_HEADER.unpack(head)
        step = flagged & ~SYNC_FLAG
        left = length
        while left:
            wake.set(left)
            n = conn.recv_into(view, min(left, len(view)))
            if not n:
                raise TransportError(f"rank {src} closed {cid} step {step} with {left} "
                                     f"of {length} bytes unsent")
            left -= n
            inbox.post((it, cid, src, step), view[:n], keep)
        if length == 0:
            inbox.post((it, cid, src, step), b"")
        if flagged & SYNC_FLAG:
            with lock:
                conn.sendall(STEP_HEADER.pack(step | SYNC_FLAG, 0))


class Listener:
    """Accepts connections on ``address`` and drains each into ``inbox`` (or the inbox its hello
    is routed to; a thread each), or hands it to ``forward`` when its hello says it is
    relayed."""

    def __init__(self, address: Address, inbox: Inbox | Route, io_timeout_s: float,
                 forward: Forward | None = None) -> None:
        self.address = address
        self.inbox = inbox
        self.forward = forward
        self.io_timeout_s = io_timeout_s
        self._stop = threading.Event()
        self.sock = _socket(address)
        if isinstance(address, str):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)  # left by an earlier run of this rank
        else:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(address)
        self.sock.listen(64)
        self.sock.settimeout(POLL_S)
        self._thread = threading.Thread(target=self._accept, daemon=True, name="listener")
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve_connection, args=(conn, self.inbox,
                                                            self.io_timeout_s, self.forward),
                             daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        if isinstance(self.address, str):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address)


class Outgoing:
    """One connection to a peer for one call: steps out, then wait for the peer's EOF."""

    def __init__(self, address: Address, hello: dict[str, Any], timeout_s: float,
                 aborted: threading.Event | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if aborted is not None and aborted.is_set():
                raise Abort
            sock = _socket(address)
            sock.settimeout(max(0.1, min(2.0, deadline - time.monotonic())))
            try:
                sock.connect(address)
                break
            except OSError as exc:  # refused before the peer listens, or lost SYN: retry
                sock.close()
                if time.monotonic() >= deadline:
                    raise TransportError(f"cannot connect to {address_text(address)} within "
                                         f"{timeout_s:.0f} s: {exc}") from exc
                threading.Event().wait(0.02)
        sock.settimeout(timeout_s)
        self.sock = sock
        self.sent = 0
        self._answers: set[tuple[int, int]] = set()  # (flag, step) answers read ahead
        sock.sendall(json.dumps(hello).encode() + b"\n")

    def send_step(self, step: int, n: int, payload: memoryview | bytes | None = None,
                  sync: bool = False) -> None:
        """Send step ``step``: ``payload`` (``n`` bytes), or ``n`` bytes of filler; a ``sync``
        step's header asks the receiver to answer once it has read the payload."""
        self.sock.sendall(STEP_HEADER.pack(step | (SYNC_FLAG if sync else 0), n))
        if payload is not None:
            if len(payload) != n:
                raise TransportError(f"step {step}: payload of {len(payload)} bytes, "
                                     f"announced {n}")
            self.sock.sendall(payload)
        else:
            left = n
            view = memoryview(FILLER)
            while left:
                k = min(left, len(view))
                self.sock.sendall(view[:k])
                left -= k
        self.sent += n

    def expect(self, flag: int, step: int) -> None:
        """Wait for the receiver's ``flag`` header for ``step`` (``READY_FLAG``: it has reached
        the step; ``SYNC_FLAG``: it has read the step's payload)."""
        while (flag, step) not in self._answers:
            head = recv_exact(self.sock, STEP_HEADER.size)
            if len(head) < STEP_HEADER.size:
                raise TransportError(f"the receiver closed before it answered step {step}")
            flagged, _ = STEP_HEADER.unpack(head)
            self._answers.add((flagged & FLAGS, flagged & ~FLAGS))
        self._answers.discard((flag, step))

    def finish(self) -> None:
        """Shut our side and wait for the receiver's EOF (it has read every byte)."""
        with self.sock:
            self.sock.shutdown(socket.SHUT_WR)
            while self.sock.recv(4096):
                pass
