"""The transport's receiving side: steps counted into the inbox, woken per chunk."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable

import pytest

from testbed.emulated.transport import RECV_WAKE_BYTES, STEP_HEADER, Inbox, serve_connection

STEP_SIZES = [1, RECV_WAKE_BYTES - 1, RECV_WAKE_BYTES, RECV_WAKE_BYTES + 1, 200_000]


def _stream(sizes: list[int]) -> bytes:
    out = json.dumps({"it": 3, "cid": "dp0", "src": 5}).encode() + b"\n"
    for step, n in enumerate(sizes):
        out += STEP_HEADER.pack(step, n) + bytes(n)
    return out


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
    return sender, conn


@pytest.mark.parametrize("pair", [_tcp_pair, socket.socketpair], ids=["tcp", "unix"])
def test_every_step_arrives_whole_with_the_wake_threshold(
        pair: Callable[[], tuple[socket.socket, socket.socket]]) -> None:
    """Over TCP (rails) and Unix sockets (a server's scale-up exchanges in torch jobs)."""
    sender, conn = pair()
    inbox = Inbox(keep_payload=True)
    reader = threading.Thread(target=serve_connection, args=(conn, inbox, 10.0))
    reader.start()
    with sender:
        sender.sendall(_stream(STEP_SIZES))
        sender.shutdown(socket.SHUT_WR)
        aborted = threading.Event()
        for step, n in enumerate(STEP_SIZES):
            assert inbox.take((3, "dp0", 5, step), n, 10.0, aborted) == bytes(n)
        assert sender.recv(1) == b""  # the receiver closed at our EOF: it read everything
    reader.join(10.0)
    assert not reader.is_alive() and not inbox.errors


class ScriptedConn:
    """A connection that hands out a byte stream and records ``SO_RCVLOWAT`` settings (a Unix
    one: the receiver sets ``TCP_NODELAY`` on TCP connections only)."""

    family = socket.AF_UNIX

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.lowat: list[int] = []

    def settimeout(self, _t: float) -> None:
        pass

    def setsockopt(self, level: int, name: int, value: int) -> None:
        assert (level, name) == (socket.SOL_SOCKET, socket.SO_RCVLOWAT)
        self.lowat.append(value)

    def recv(self, n: int) -> bytes:
        out, self.data = bytes(self.data[:n]), self.data[n:]
        return out

    def recv_into(self, view: memoryview, n: int) -> int:
        k = min(n, len(self.data), 1448)  # one segment at a time
        view[:k] = self.data[:k]
        self.data = self.data[k:]
        return k

    def __enter__(self) -> ScriptedConn:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.mark.parametrize("size", [1, RECV_WAKE_BYTES + 1, 3 * RECV_WAKE_BYTES])
def test_receiver_wakes_per_chunk_and_at_the_last_byte_of_a_step(size: int) -> None:
    conn = ScriptedConn(_stream([size]))
    inbox = Inbox()
    serve_connection(conn, inbox, 10.0)  # type: ignore[arg-type]
    # a whole header, then at most a chunk or what is left of the step, then the next header
    expected, left = [STEP_HEADER.size], size
    while left:
        if min(left, RECV_WAKE_BYTES) != expected[-1]:
            expected.append(min(left, RECV_WAKE_BYTES))
        left -= min(left, 1448)
    assert conn.lowat == [*expected, STEP_HEADER.size]
    assert inbox.wait((3, "dp0", 5, 0), size, 1.0, threading.Event()) == size
