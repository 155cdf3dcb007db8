"""The rank-to-rank TCP transport of a collective call, shared by the replayer and torch jobs.

A call opens one connection per peer it sends to, after Opus acknowledged it (the circuits are
lit), and closes it before the call completes, so nothing is open across a switch. The sender
introduces the connection with a JSON line (``it``, ``cid``, ``src``) and sends each algorithm
step as a 12-byte header (step, length) plus payload. The receiving rank's :class:`Listener`
drains every incoming connection into its :class:`Inbox`, keyed by (iteration, call id, sender,
step): sends are eager, so a receiver never has to be waiting for them. A sender finishes by
shutting its side down and waiting for the receiver's EOF: the bytes have then been read by the
peer, not only queued.

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
FILLER = bytes(range(256)) * 1024  # 256 KiB of filler, sent in slices when there is no payload
POLL_S = 0.25

#: (iteration, call id, sender rank, step)
Key = tuple[int, str, int, int]
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
    """Bytes received per (iteration, call id, sender, step), with waiting."""

    def __init__(self, *, keep_payload: bool = False) -> None:
        self.keep_payload = keep_payload
        self._cv = threading.Condition()
        self._got: dict[Key, int] = {}
        self._data: dict[Key, bytearray] = {}
        self.errors: list[str] = []

    def post(self, key: Key, chunk: memoryview | bytes) -> None:
        with self._cv:
            self._got[key] = self._got.get(key, 0) + len(chunk)
            if self.keep_payload:
                self._data.setdefault(key, bytearray()).extend(chunk)
            self._cv.notify_all()

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


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


#: an incoming connection's hello -> the inbox its bytes go to (None: drop the connection)
Route = Callable[[dict[str, Any]], Inbox | None]


def serve_connection(conn: socket.socket, inbox: Inbox | Route, io_timeout_s: float) -> None:
    """Drain one incoming connection into ``inbox`` (or the one its hello is routed to); close
    it at the sender's EOF."""
    sink: Inbox | None = inbox if isinstance(inbox, Inbox) else None
    with conn:
        try:
            conn.settimeout(io_timeout_s)
            line = bytearray()
            while not line.endswith(b"\n"):
                ch = conn.recv(1)
                if not ch:
                    return
                line += ch
            hello = json.loads(line)
            it, cid, src = int(hello["it"]), str(hello["cid"]), int(hello["src"])
            if sink is None:
                assert not isinstance(inbox, Inbox)
                sink = inbox(hello)
                if sink is None:
                    return  # a connection nobody waits for (an abandoned epoch's)
            view = memoryview(bytearray(1 << 18))
            while True:
                head = _recv_exact(conn, STEP_HEADER.size)
                if not head:
                    return  # EOF: the sender is done; closing tells it we read everything
                if len(head) < STEP_HEADER.size:
                    raise TransportError(f"truncated step header from rank {src} for {cid}")
                step, length = STEP_HEADER.unpack(head)
                left = length
                while left:
                    n = conn.recv_into(view, min(left, len(view)))
                    if not n:
                        raise TransportError(f"rank {src} closed {cid} step {step} with {left} "
                                             f"of {length} bytes unsent")
                    left -= n
                    sink.post((it, cid, src, step), view[:n])
                if length == 0:
                    sink.post((it, cid, src, step), b"")
        except (OSError, ValueError, KeyError, TransportError) as exc:
            if sink is not None:
                sink.fail(f"incoming connection: {type(exc).__name__}: {exc}")


class Listener:
    """Accepts connections on ``address`` and drains each into ``inbox`` (or the inbox its hello
    is routed to; a thread each)."""

    def __init__(self, address: Address, inbox: Inbox | Route, io_timeout_s: float) -> None:
        self.address = address
        self.inbox = inbox
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
                                                            self.io_timeout_s),
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
        sock.sendall(json.dumps(hello).encode() + b"\n")

    def send_step(self, step: int, n: int, payload: memoryview | None = None) -> None:
        """Send step ``step``: ``payload`` (``n`` bytes), or ``n`` bytes of filler."""
        self.sock.sendall(STEP_HEADER.pack(step, n))
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

    def finish(self) -> None:
        """Shut our side and wait for the receiver's EOF (it has read every byte)."""
        with self.sock:
            self.sock.shutdown(socket.SHUT_WR)
            while self.sock.recv(4096):
                pass
