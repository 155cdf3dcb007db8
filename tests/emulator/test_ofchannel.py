"""emulator.ofchannel against a scripted switch on a Unix socket: hello, barrier replies found
among other messages, echo requests answered, errors and silence turned into ChannelError."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from emulator.ofchannel import (
    OFPMP_PORT_STATS,
    OFPT_BARRIER_REPLY,
    OFPT_BARRIER_REQUEST,
    OFPT_ECHO_REPLY,
    OFPT_ECHO_REQUEST,
    OFPT_ERROR,
    OFPT_HELLO,
    OFPT_MULTIPART_REQUEST,
    ChannelError,
    OpenFlowChannel,
    barrier_request,
    mgmt_socket,
    port_stats_request,
)

HEADER = struct.Struct("!BBHI")
Script = Callable[[socket.socket], None]


def message(msg_type: int, xid: int, body: bytes = b"") -> bytes:
    return HEADER.pack(4, msg_type, HEADER.size + len(body), xid) + body


def read_message(conn: socket.socket) -> tuple[int, int, bytes]:
    head = b""
    while len(head) < HEADER.size:
        head += conn.recv(HEADER.size - len(head))
    _v, msg_type, length, xid = HEADER.unpack(head)
    body = b""
    while len(body) < length - HEADER.size:
        body += conn.recv(length - HEADER.size - len(body))
    return msg_type, xid, body


@pytest.fixture
def switch(tmp_path: Path) -> Iterator[Callable[[Script], str]]:
    """Start a one-connection scripted switch; returns its socket path. The script runs after
    the hello exchange; whatever it asserts is re-raised in the test."""
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def start(script: Script) -> str:
        path = str(tmp_path / "br.mgmt")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)

        def serve() -> None:
            conn, _ = server.accept()
            try:
                assert read_message(conn)[0] == OFPT_HELLO
                conn.sendall(message(OFPT_HELLO, 7))
                script(conn)
            except BaseException as exc:  # handed to the test below
                errors.append(exc)
            finally:
                conn.close()
                server.close()

        threads.append(threading.Thread(target=serve, daemon=True))
        threads[-1].start()
        return path

    yield start
    for t in threads:
        t.join(timeout=10)
    if errors:
        raise errors[0]


def test_barriers_are_found_among_other_messages_and_echoes_answered(
        switch: Callable[[Script], str]) -> None:
    def script(conn: socket.socket) -> None:
        flow_mod = read_message(conn)
        assert flow_mod == (14, 0, b"flow")
        (t1, x1, _), (t2, x2, _) = read_message(conn), read_message(conn)
        assert (t1, t2) == (OFPT_BARRIER_REQUEST, OFPT_BARRIER_REQUEST)
        # an echo request, then the second barrier's reply before the first's, in one write
        conn.sendall(message(OFPT_ECHO_REQUEST, 99, b"ping") + message(OFPT_BARRIER_REPLY, x2)
                     + message(OFPT_BARRIER_REPLY, x1))
        assert read_message(conn) == (OFPT_ECHO_REPLY, 99, b"ping")

    channel = OpenFlowChannel(switch(script), timeout_s=5)
    channel.send(message(14, 0, b"flow") + barrier_request(11) + barrier_request(12))
    channel.wait([11, 12])
    channel.close()


def test_an_openflow_error_names_the_refused_message(switch: Callable[[Script], str]) -> None:
    def script(conn: socket.socket) -> None:
        read_message(conn)
        conn.sendall(message(OFPT_ERROR, 0, struct.pack("!HH", 5, 2)))

    channel = OpenFlowChannel(switch(script), timeout_s=5)
    channel.send(barrier_request(3))
    with pytest.raises(ChannelError, match="refused message xid 0: OpenFlow error type 5 code 2"):
        channel.wait([3])
    channel.close()


def test_silence_and_a_closed_connection_are_errors(switch: Callable[[Script], str]) -> None:
    done = threading.Event()

    def script(conn: socket.socket) -> None:
        read_message(conn)
        done.wait(10)  # never answers the barrier

    channel = OpenFlowChannel(switch(script), timeout_s=5)
    channel.send(barrier_request(4))
    with pytest.raises(ChannelError, match="did not answer within"):
        channel.wait([4], timeout_s=0.2)
    done.set()
    with pytest.raises(ChannelError, match="closed the connection"):
        channel.wait([4], timeout_s=5)
    channel.close()


def test_no_bridge_socket_is_a_channel_error(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVS_RUNDIR", str(tmp_path))
    assert mgmt_socket("otab1r0") == str(tmp_path / "otab1r0.mgmt")
    with pytest.raises(ChannelError, match=r"otab1r0\.mgmt"):
        OpenFlowChannel(mgmt_socket("otab1r0"), timeout_s=1)


def test_a_port_stats_request_names_its_port_or_every_port() -> None:
    """The OCS app asks for the touched ports' counters one port per request (cheaper for the
    switch than every port's); without a port the request asks for every port (OFPP_ANY)."""
    for port, wanted in ((5, 5), (None, 0xFFFFFFFF)):
        data = port_stats_request(9) if port is None else port_stats_request(9, port)
        version, msg_type, length, xid = HEADER.unpack_from(data)
        assert (version, msg_type, length, xid) == (4, OFPT_MULTIPART_REQUEST, len(data), 9)
        kind, flags, asked = struct.unpack_from("!HH4xI", data, HEADER.size)
        assert (kind, flags, asked) == (OFPMP_PORT_STATS, 0, wanted)
