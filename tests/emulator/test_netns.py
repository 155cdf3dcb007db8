"""Entering a network namespace moves only the calling thread, and what it opens stays there.

Needs root: each test makes a namespace with ``ip netns add`` under a name of its own and
deletes it afterwards.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from emulator.netns import enter_netns, netns_id, netns_path, socket_netns_id

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="entering a network namespace needs root and ip(8)")


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh namespace with its loopback up; the path of its handle."""
    name = f"ot-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield f"/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def _in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()``'s result (or its exception) on a thread of its own."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the thread did not finish"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_only_the_calling_thread_moves(netns: str) -> None:
    ours = netns_id()
    target = netns_id(netns)
    assert ours != target

    def inside() -> tuple[int, int, int]:
        enter_netns(netns)
        with socket.socket() as sock:
            return netns_id(), socket_netns_id(sock), _in_thread(netns_id)

    thread_ns, sock_ns, child_ns = _in_thread(inside)
    assert thread_ns == target and sock_ns == target
    assert child_ns == target, "a thread started in the namespace must inherit it"
    assert netns_id() == ours, "the main thread must stay where it was"
    with socket.socket() as sock:
        assert socket_netns_id(sock) == ours


def test_a_socket_keeps_its_namespace_on_another_thread(netns: str) -> None:
    def make() -> socket.socket:
        enter_netns(netns)
        return socket.socket()

    sock = _in_thread(make)
    with sock:
        assert socket_netns_id(sock) == netns_id(netns)  # asked from the main thread


def test_zmq_connects_from_the_namespace_of_the_thread_that_made_its_socket(netns: str) -> None:
    """The shim's ZeroMQ context opens its TCP connections on I/O threads of its own: they must
    be in the rank's namespace. The only listener is inside the namespace, on its loopback,
    so a connection from anywhere else never arrives."""

    def serve_and_connect() -> bytes:
        enter_netns(netns)
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            server.settimeout(10)
            port = server.getsockname()[1]
            ctx = zmq.Context()
            try:
                push = ctx.socket(zmq.DEALER)
                push.setsockopt(zmq.LINGER, 0)
                push.connect(f"tcp://127.0.0.1:{port}")
                conn, _ = server.accept()
                with conn:
                    conn.settimeout(10)
                    greeting = conn.recv(10)  # ZMTP's signature: 0xff ... 0x7f
                push.close()
            finally:
                ctx.term()
        return greeting

    assert _in_thread(serve_and_connect)[:1] == b"\xff"


def test_a_process_namespace_path() -> None:
    assert netns_id(netns_path(os.getpid())) == netns_id()


def test_entering_a_missing_namespace_names_it() -> None:
    with pytest.raises(OSError, match="no-such-netns"):
        _in_thread(lambda: enter_netns("/run/netns/no-such-netns"))
