"""A rank forwarding another's transfer (:mod:`testbed.emulated.relay`), on loopback: a Unix
socket leg (the scale-up domain) then a TCP leg (a rail circuit), with the payload, a sync
step's rendezvous and the EOF handshake passing end to end, and the relays' byte counts."""

from __future__ import annotations

import threading
from pathlib import Path

from emulator.network import free_tcp_port
from testbed.emulated.relay import Relay
from testbed.emulated.transport import READY_FLAG, SYNC_FLAG, Inbox, Listener, Outgoing

NEVER = threading.Event()


def test_a_transfer_crosses_two_relays_whole_with_its_sync_step_and_eof(tmp_path: Path
                                                                         ) -> None:
    sink = Inbox(keep_payload=True)
    port = free_tcp_port()
    unix_b, unix_c = str(tmp_path / "b.sock"), str(tmp_path / "c.sock")
    relay_b, relay_c = Relay(5), Relay(5)
    spare = Inbox()  # the relays' own inboxes: nothing may land there
    listeners = [Listener(unix_b, spare, 5, relay_b), Listener(unix_c, spare, 5, relay_c),
                 Listener(("127.0.0.1", port), sink, 5)]
    try:
        # a -> b (Unix) -> c (Unix) -> d (TCP); the hello names the stations after the first
        out = Outgoing(unix_b, {"it": 0, "cid": "ep0:x", "src": 7,
                                "via": [unix_c, ["127.0.0.1", port]]}, 5)
        big = bytes(range(256)) * 2000
        out.send_step(0, len(big), memoryview(big))
        answered = threading.Event()

        def sender() -> None:
            out.expect(READY_FLAG, 1)
            out.send_step(1, 1000, sync=True)
            out.expect(SYNC_FLAG, 1)
            answered.set()

        thread = threading.Thread(target=sender, daemon=True)
        thread.start()
        assert sink.take((0, "ep0:x", 7, 0), len(big), 5, NEVER) == big  # from rank 7, whole
        sink.ready((0, "ep0:x", 7), 1, 5, NEVER)  # READY travels back through both relays
        assert sink.wait((0, "ep0:x", 7, 1), 1000, 5, NEVER) == 1000
        assert answered.wait(5)  # and SYNC once read
        thread.join(5)
        out.finish()  # returns once the last station read everything: the EOF came back
        for relay in (relay_b, relay_c):
            assert relay.counters() == {"forwarded_bytes": len(big) + 1000, "connections": 1,
                                        "errors": []}
        assert not sink.errors and not spare.errors
    finally:
        for listener in listeners:
            listener.close()


def test_a_relay_whose_next_station_is_gone_says_so_and_the_sender_sees_eof(tmp_path: Path
                                                                             ) -> None:
    relay = Relay(0.5)
    path = str(tmp_path / "b.sock")
    listener = Listener(path, Inbox(), 5, relay)
    try:
        out = Outgoing(path, {"it": 0, "cid": "c", "src": 1,
                              "via": [str(tmp_path / "nobody.sock")]}, 5)
        assert out.sock.recv(1) == b""  # the relay closed: no station to reach
        out.sock.close()
        errors = relay.counters()["errors"]
        assert len(errors) == 1 and "relay of rank 1's c" in errors[0], errors
    finally:
        listener.close()
