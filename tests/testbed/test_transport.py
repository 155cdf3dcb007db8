"""The call transport on loopback: payload and counting inboxes, EOF handshake, timeouts."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from emulator.network import free_tcp_port
from testbed.emulated.transport import Inbox, Listener, Outgoing, TransportError

NEVER = threading.Event()  # an abort flag that is never set


@contextlib.contextmanager
def _listening(inbox: Inbox) -> Iterator[int]:
    """A listener on a free loopback port draining into ``inbox``; yields the port."""
    port = free_tcp_port()
    listener = Listener(("127.0.0.1", port), inbox, io_timeout_s=5)
    try:
        yield port
    finally:
        listener.close()


def test_payload_steps_arrive_whole_and_in_place() -> None:
    inbox = Inbox(keep_payload=True)
    with _listening(inbox) as port:
        out = Outgoing(("127.0.0.1", port), {"it": 0, "cid": "fsdp0-1:3", "src": 1}, 5)
        big = bytes(range(256)) * 3000
        out.send_step(0, len(big), memoryview(big))
        out.send_step(1, 0, memoryview(b""))
        out.finish()  # returns once the listener read everything and closed
        assert inbox.take((0, "fsdp0-1:3", 1, 0), len(big), 5, NEVER) == big
        assert inbox.take((0, "fsdp0-1:3", 1, 1), 0, 5, NEVER) == b""
        assert out.sent == len(big) and not inbox.errors


def test_filler_is_counted_and_a_missing_step_times_out_naming_it() -> None:
    inbox = Inbox()
    with _listening(inbox) as port:
        out = Outgoing(("127.0.0.1", port), {"it": 2, "cid": "dp0:x", "src": 4}, 5)
        out.send_step(0, 300_000)
        out.finish()
        assert inbox.wait((2, "dp0:x", 4, 0), 300_000, 5, NEVER) == 300_000
        with pytest.raises(TransportError, match=r"received 0 of 10 bytes from rank 4 for "
                           r"dp0:x step 1 \(iteration 2\) within 0 s"):
            inbox.wait((2, "dp0:x", 4, 1), 10, 0.2, NEVER)


def test_a_payload_of_the_wrong_size_is_refused() -> None:
    with _listening(Inbox(keep_payload=True)) as port:
        out = Outgoing(("127.0.0.1", port), {"it": 0, "cid": "c", "src": 0}, 5)
        with pytest.raises(TransportError, match="payload of 3 bytes, announced 4"):
            out.send_step(0, 4, memoryview(b"abc"))
        out.sock.close()
