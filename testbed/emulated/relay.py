"""A rank process forwarding another rank's transfer along the static plane's path (issue 40).

Under ``controller.plane: static`` a transfer between ranks whose servers have no direct circuit
(or whose circuit is on another rail) crosses other ranks (:func:`controller.planes.relay
.stations`): over a rail circuit between servers (TCP to the next station's rail address), or
over the scale-up domain inside a server (the next station's Unix socket, free NVLink as the sim
assumes). The sender connects to the first station with the transport's hello plus ``via``, the
addresses of the stations after it (:mod:`testbed.emulated.transport`). A station whose incoming
hello has a non-empty ``via`` is a relay: it connects to ``via[0]`` with the same hello and the
rest of ``via``, and pumps bytes both ways until both sides are done:

* forward, step by step (12-byte header, payload), counting the payload bytes it carries
  (:attr:`Relay.forwarded`), and at the sender's EOF it shuts its side of the next leg;
* back, as they come (the receiver's ``READY``/``SYNC`` answers), and at the next leg's EOF
  (the receiver read everything) it shuts its side toward the sender.

So the sync steps' rendezvous and the EOF handshake of :meth:`Outgoing.finish` pass end to end:
a sender's ``finish`` returns once the last receiver has read every byte. A relay holds no
buffer beyond a socket read (cut-through, as the sim's relays).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from testbed.emulated.transport import (
    STEP_HEADER,
    Address,
    Outgoing,
    TransportError,
    recv_exact,
)

CHUNK_BYTES = 1 << 18


def address_of(value: Any) -> Address:
    """A station's address from its JSON form: a Unix socket path, or ``[host, port]``."""
    if isinstance(value, str):
        return value
    host, port = value
    return (str(host), int(port))


class Relay:
    """This rank's forwarding of others' transfers, with its counters (see the module
    docstring)."""

    def __init__(self, io_timeout_s: float) -> None:
        self.io_timeout_s = io_timeout_s
        self._lock = threading.Lock()
        self.forwarded = 0  # payload bytes carried for others
        self.connections = 0
        self.errors: list[str] = []

    def counters(self) -> dict[str, Any]:
        with self._lock:
            return {"forwarded_bytes": self.forwarded, "connections": self.connections,
                    "errors": list(self.errors)}

    def __call__(self, conn: socket.socket, hello: dict[str, Any]) -> None:
        """Forward ``conn`` (its hello read) to the next station; returns when both
        directions are done (the caller closes ``conn``)."""
        via = [address_of(a) for a in hello["via"]]
        onward = {k: v for k, v in hello.items() if k != "via"}
        if len(via) > 1:
            onward["via"] = hello["via"][1:]
        try:
            nxt = Outgoing(via[0], onward, self.io_timeout_s)
        except (OSError, TransportError) as exc:
            self._fail(f"relay of rank {hello.get('src')}'s {hello.get('cid')}: {exc}")
            return
        with self._lock:
            self.connections += 1
        back = threading.Thread(target=self._back, args=(nxt.sock, conn), daemon=True,
                                name="relay-back")
        back.start()
        try:
            self._forward(conn, nxt.sock, hello)
        except (OSError, TransportError) as exc:
            self._fail(f"relay of rank {hello.get('src')}'s {hello.get('cid')}: "
                       f"{type(exc).__name__}: {exc}")
            for s in (nxt.sock, conn):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        back.join(self.io_timeout_s)
        nxt.sock.close()

    def _fail(self, message: str) -> None:
        with self._lock:
            self.errors.append(message)

    def _forward(self, src: socket.socket, dst: socket.socket, hello: dict[str, Any]) -> None:
        view = memoryview(bytearray(CHUNK_BYTES))
        while True:
            head = recv_exact(src, STEP_HEADER.size)
            if not head:
                dst.shutdown(socket.SHUT_WR)  # the sender is done: so is this leg
                return
            if len(head) < STEP_HEADER.size:
                raise TransportError(f"truncated step header from rank {hello.get('src')}")
            dst.sendall(head)
            _, left = STEP_HEADER.unpack(head)
            while left:
                n = src.recv_into(view, min(left, CHUNK_BYTES))
                if not n:
                    raise TransportError(f"rank {hello.get('src')} closed with {left} bytes "
                                         "of a step unsent")
                dst.sendall(view[:n])
                left -= n
                with self._lock:
                    self.forwarded += n

    def _back(self, src: socket.socket, dst: socket.socket) -> None:
        """The receiver's answers toward the sender; at its EOF, shut that side."""
        try:
            while True:
                chunk = src.recv(4096)
                if not chunk:
                    break
                dst.sendall(chunk)
            dst.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self._fail(f"relay answers: {type(exc).__name__}: {exc}")
