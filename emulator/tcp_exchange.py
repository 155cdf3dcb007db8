"""One side of a TCP exchange between two ranks, for ``opus-testbed bench tcp``.

Run inside a rank's namespace: listen on ``ADDR:PORT`` (with ``RECEIVE`` 1, drain what the
peer sends) and print ``listening``; then read a wall-clock instant from stdin (the caller sends
it once both sides listen, :func:`emulator.bench.start_exchange`), and at that instant connect
to ``PEER:PORT`` and send ``SEND_BYTES``, then shut down and wait for the peer's EOF (it has
read every byte). Prints the seconds from connect to that EOF, or nothing when ``SEND_BYTES``
is 0.

    python -m emulator.tcp_exchange ADDR PEER PORT SEND_BYTES RECEIVE
"""

from __future__ import annotations

import socket
import sys
import threading
import time

CHUNK = bytes(1 << 16)


def _drain(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    buf = bytearray(1 << 18)
    with conn:
        while conn.recv_into(buf):
            pass


def main(argv: list[str]) -> int:
    addr, peer, port = argv[0], argv[1], int(argv[2])
    send_bytes, receive = int(argv[3]), argv[4] == "1"
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((addr, port))
    listener.listen(1)
    listener.settimeout(60)
    drain = threading.Thread(target=_drain, args=(listener,))
    if receive:
        drain.start()
    print("listening", flush=True)
    start = float(sys.stdin.readline())
    if send_bytes:
        threading.Event().wait(max(0.0, start - time.time()))  # both sides start on the clock
        sock = socket.create_connection((peer, port), timeout=60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.monotonic()
        left = send_bytes
        while left:
            n = sock.send(CHUNK[:min(left, len(CHUNK))])
            left -= n
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(4096):
            pass
        sock.close()
        print(f"{time.monotonic() - t0:.6f}", flush=True)
    if receive:
        drain.join(60)
    listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
