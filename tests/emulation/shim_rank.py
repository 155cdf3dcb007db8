"""A rank process for the emulated controller tests: real shim, real TCP over the lit circuits.

Run inside a rank's Mininet namespace (``EmulatedRails.popen``) as a script::

    python shim_rank.py PLAN_JSON

``PLAN_JSON`` holds ``endpoint``, ``job``, ``rank``, ``addr`` (this rank's rail address),
``rounds``, ``bytes``, ``port_base``, ``calls`` (one round: ``[{"group", "peer", "peer_addr"}]``)
and optionally ``stall`` (``{"round", "group", "after_bytes"}``: in that call send only that many
bytes, report ``stalled`` and wait to be killed). For each round and call the rank wraps a real
exchange with its peer in ``shim.collective``: the lower rank listens on its rail address, the
higher connects (polling until a deadline), both send a header plus a deterministic payload and
read the peer's until EOF. Everything is reported as JSON lines on stdout:

* ``{"event": "call", group, round, seq, peer, reconfigured, wait_s, sent, received, ok, error}``
* ``{"event": "stalled", ...}`` (the call the test kills us in)
* ``{"event": "rejected", group, round, code, message}`` then exit 2 (the controller refused)
* ``{"event": "unavailable", ...}`` then exit 3 (no controller)
* ``{"event": "finished", rank}`` then exit 0
"""

from __future__ import annotations

import fcntl
import json
import random
import socket
import struct
import sys
import termios
import threading
import time
from typing import Any

from controller.shim import ControllerUnavailable, IntentRejected, Shim

CONNECT_TIMEOUT_S = 10.0
IO_TIMEOUT_S = 10.0
HEADER = struct.Struct("!8sIII")  # group tag, round, sender rank, payload length


def emit(**fields: Any) -> None:
    print(json.dumps({**fields, "t": time.time()}), flush=True)


def payload(group: str, rnd: int, src: int, n: int) -> bytes:
    """Deterministic bytes that only the right sender sends in the right call."""
    return HEADER.pack(group.encode()[:8], rnd, src, n) + random.Random(
        f"{group}/{rnd}/{src}").randbytes(n)


def open_channel(me: int, addr: str, peer: int, peer_addr: str, port: int) -> socket.socket:
    """The lower rank accepts, the higher connects; both give up after CONNECT_TIMEOUT_S."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    if me < peer:
        with socket.socket() as lsock:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind((addr, port))
            lsock.listen(1)
            lsock.settimeout(CONNECT_TIMEOUT_S)
            conn, (src, _) = lsock.accept()
            if src != peer_addr:
                conn.close()
                raise ConnectionError(f"accepted {src}, expected peer {peer_addr}")
            conn.settimeout(IO_TIMEOUT_S)
            return conn
    last: Exception | None = None
    while time.monotonic() < deadline:
        sock = socket.socket()
        sock.settimeout(0.5)
        try:
            sock.connect((peer_addr, port))
            sock.settimeout(IO_TIMEOUT_S)
            return sock
        except OSError as exc:  # refused (not listening yet) or timed out: poll again
            last = exc
            sock.close()
            # a refused connect returns at once: pace the retries at ~20 Hz
            threading.Event().wait(0.05)
    raise TimeoutError(f"could not connect to rank {peer} at {peer_addr}:{port} within "
                       f"{CONNECT_TIMEOUT_S} s (last error: {last})")


def unacked(sock: socket.socket) -> int:
    """Bytes in the send queue not yet acknowledged by the peer (SIOCOUTQ)."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])


def exchange(plan: dict[str, Any], call: dict[str, Any], rnd: int, index: int,
             stall_after: int | None) -> dict[str, Any]:
    """One full-duplex exchange with the call's peer; returns what happened."""
    me, n = int(plan["rank"]), int(plan["bytes"])
    peer, group = int(call["peer"]), str(call["group"])
    port = int(plan["port_base"]) + rnd * len(plan["calls"]) + index
    out = payload(group, rnd, me, n)
    expected = payload(group, rnd, peer, n)
    sent = 0
    received = bytearray()
    sock = open_channel(me, str(plan["addr"]), peer, str(call["peer_addr"]), port)
    send_error: list[BaseException] = []

    def sender() -> None:
        nonlocal sent
        try:
            data = out if stall_after is None else out[:stall_after]
            sock.sendall(data)
            sent = len(data)
            if stall_after is None:
                sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            send_error.append(exc)

    with sock:
        t = threading.Thread(target=sender, daemon=True)
        t.start()
        if stall_after is not None:
            t.join(IO_TIMEOUT_S)
            if t.is_alive():
                raise TimeoutError(f"sending {stall_after} bytes to rank {peer} took over "
                                   f"{IO_TIMEOUT_S} s")
            # report only once the peer's kernel has acknowledged every byte sent, so the peer
            # really is mid-call with part of the data when the test kills us
            deadline = time.monotonic() + IO_TIMEOUT_S
            while unacked(sock) and time.monotonic() < deadline:
                threading.Event().wait(0.01)
            emit(event="stalled", rank=me, group=group, round=rnd, peer=peer, sent=sent,
                 unacked=unacked(sock))
            threading.Event().wait(60)  # the test kills us here; never returns normally
            raise TimeoutError("stalled rank was not killed within 60 s")
        error = ""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
        t.join(IO_TIMEOUT_S)
        if t.is_alive() and not error:
            error = f"send: still blocked {IO_TIMEOUT_S} s after the peer's data ended"
        elif send_error and not error:
            error = f"send: {send_error[0]}"
    ok = bytes(received) == expected and sent == len(out) and not error
    if not ok and not error:
        error = f"got {len(received)} of {len(expected)} bytes" + (
            "" if expected.startswith(bytes(received)) else " (corrupt)")
    return {"peer": peer, "sent": sent, "received": len(received),
            "expected": len(expected), "ok": ok, "error": error}


def main() -> int:
    plan = json.loads(sys.argv[1])
    rank = int(plan["rank"])
    stall = plan.get("stall") or {}
    with Shim(str(plan["endpoint"]), str(plan["job"]), rank, heartbeat_interval_s=0.2,
              ack_timeout_s=float(plan.get("ack_timeout_s", 20.0))) as shim:
        for rnd in range(int(plan["rounds"])):
            shim.mark_iteration()
            for index, call in enumerate(plan["calls"]):
                group = str(call["group"])
                stall_after = (int(stall["after_bytes"]) if stall.get("round") == rnd
                               and stall.get("group") == group else None)
                try:
                    with shim.collective(group, "sendrecv", int(plan["bytes"]),
                                         str(call.get("axis", ""))) as grant:
                        try:
                            result = exchange(plan, call, rnd, index, stall_after)
                        except OSError as exc:  # connect/accept failed: report, go on
                            result = {"peer": call["peer"], "sent": 0, "received": 0,
                                      "ok": False, "error": f"{type(exc).__name__}: {exc}"}
                        emit(event="call", rank=rank, group=group, round=rnd, seq=grant.seq,
                             reconfigured=grant.reconfigured, wait_s=grant.wait_s, **result)
                except IntentRejected as exc:
                    emit(event="rejected", rank=rank, group=group, round=rnd, code=exc.code,
                         message=str(exc))
                    return 2
                except ControllerUnavailable as exc:
                    emit(event="unavailable", rank=rank, group=group, round=rnd,
                         message=str(exc))
                    return 3
    emit(event="finished", rank=rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
