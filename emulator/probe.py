"""Data-plane probes: a timestamped raw-frame stream and a frame recorder, run inside ranks.

``python -m emulator.probe send --intf I --interval-us 100 --duration-s 5`` sends numbered
Ethernet frames (ethertype 0x88B5, IEEE local experimental; broadcast destination, since a
circuit forwards by port, not address). ``python -m emulator.probe record --intf I --out F``
records every frame seen on an interface with its kernel receive time (``SO_TIMESTAMPNS``), its
direction and, for probe frames, the stream and sequence number; it prints ``ready`` once bound
and writes ``F`` (JSON lines) when terminated. Analysis helpers are pure functions.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ETH_P_ALL = 0x0003
PROBE_ETHERTYPE = 0x88B5
MAGIC = b"OPUS"
_PAYLOAD = struct.Struct("!4sIQd")  # magic, stream id, sequence number, send time (s)
SO_TIMESTAMPNS = 35
PACKET_OUTGOING = 4
#: The most wake-ups a second of :func:`send_many`'s loop (:func:`turns_per_wakeup`).
MAX_WAKEUPS_PER_S = 1000.0


@dataclass(frozen=True)
class Frame:
    """One recorded frame."""

    t_s: float
    outgoing: bool
    ethertype: int
    src: str
    dst: str
    length: int
    stream: int | None = None
    seq: int | None = None
    ip_src: str | None = None
    ip_dst: str | None = None

    def to_json(self) -> dict[str, object]:
        return self.__dict__.copy()


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def parse_frame(data: bytes, t_s: float, outgoing: bool) -> Frame:
    ethertype = int.from_bytes(data[12:14], "big") if len(data) >= 14 else 0
    stream = seq = None
    ip_src = ip_dst = None
    if ethertype == 0x0800 and len(data) >= 34:
        ip_src = socket.inet_ntoa(data[26:30])
        ip_dst = socket.inet_ntoa(data[30:34])
    if ethertype == PROBE_ETHERTYPE and len(data) >= 14 + _PAYLOAD.size:
        magic, stream_id, seq_no, _ = _PAYLOAD.unpack_from(data, 14)
        if magic == MAGIC:
            stream, seq = stream_id, seq_no
    return Frame(t_s, outgoing, ethertype, _mac(data[6:12]), _mac(data[0:6]), len(data),
                 stream, seq, ip_src, ip_dst)


def send(intf: str, interval_us: float, duration_s: float, stream: int,
         dst_mac: str = "ff:ff:ff:ff:ff:ff") -> int:
    """Send probe frames until ``duration_s`` elapses; returns the number sent."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((intf, 0))
    src = sock.getsockname()[4][:6]
    header = bytes.fromhex(dst_mac.replace(":", "")) + src + PROBE_ETHERTYPE.to_bytes(2, "big")
    pad = b"\0" * max(0, 60 - len(header) - _PAYLOAD.size)
    with contextlib.suppress(OSError):  # a steadier stream where the kernel allows it
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(20))
    interval_s = interval_us / 1e6
    stop = time.monotonic() + duration_s
    seq = 0
    print("sending", flush=True)
    next_t = time.monotonic()
    while next_t < stop:
        sock.send(header + _PAYLOAD.pack(MAGIC, stream, seq, time.time()) + pad)
        seq += 1
        next_t += interval_s
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_t = time.monotonic()  # fell behind: do not burst
    return seq


@dataclass
class BusyPort:
    """Whether a probed port carried data frames since its last turn, from a packet counter of
    the port (:func:`send_many`): the bridge side's ``rx_packets`` counts every frame the rank
    sent into the switch there, the probes included, so a count that grew by more than the
    probes sent since the last look means the port carried data; its data frames then mark
    its circuit's edges on the wire as well as a probe would, and the probe is skipped."""

    fd: int | None  # an open counter file (sysfs, read again from offset 0), or None: never busy
    last: int | None = None
    probes_since: int = 0

    def busy(self) -> bool:
        """True when the counter grew by more than this port's own probes since the last look
        (the first look, and a counter that cannot be read, say not busy)."""
        if self.fd is None:
            return False
        try:
            now = int(os.pread(self.fd, 32, 0))
        except (OSError, ValueError):
            return False
        grew = None if self.last is None else now - self.last - self.probes_since
        self.last, self.probes_since = now, 0
        return grew is not None and grew > 0


@dataclass
class SendStats:
    """What :func:`send_many` did: probe frames sent, and skipped on busy ports."""

    sent: int = 0
    skipped: int = 0

    def to_json(self) -> dict[str, int]:
        return {"sent": self.sent, "skipped": self.skipped}


def send_many(targets: Sequence[tuple[str, str]], interval_us: float, duration_s: float,
              stream: int, counters: Sequence[str | None] | None = None,
              stats: SendStats | None = None, stop_flag: list[bool] | None = None) -> int:
    """Send probe frames from several interfaces, each in its own network namespace, from one
    process: ``targets`` are (namespace path, interface); each gets a frame every
    ``interval_us``, the interfaces taking turns evenly inside the interval. One process and
    one timer for every port keeps the cost of a run-wide stream low (the wire check's,
    :mod:`emulator.wirecap`). No real-time priority: the stream must not steal the CPU the
    switch and the ranks need. ``counters`` (one per target, or None) are packet counter
    files of each port (:class:`BusyPort`): a port that carried data since its last turn is not
    probed that turn, since its data already shows its circuit on the wire (docs/wire.md,
    "Cheaper probes"). ``stats`` receives the counts; ``stop_flag[0]`` set stops the loop.
    Returns the frames sent."""
    from emulator.netns import enter_netns

    if counters is not None and len(counters) != len(targets):
        raise ValueError(f"send_many: {len(counters)} counters for {len(targets)} targets")
    home = "/proc/thread-self/ns/net"
    home_fd = os.open(home, os.O_RDONLY | os.O_CLOEXEC)
    socks: list[tuple[socket.socket, bytes]] = []
    try:
        for ns_path, intf in targets:
            enter_netns(ns_path)
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            sock.bind((intf, 0))
            src = sock.getsockname()[4][:6]
            socks.append((sock, b"\xff" * 6 + src + PROBE_ETHERTYPE.to_bytes(2, "big")))
            enter_netns(f"/proc/self/fd/{home_fd}")
    finally:
        os.close(home_fd)
    ports = [BusyPort(_open_counter(c)) for c in (counters or [None] * len(socks))]
    stats = stats if stats is not None else SendStats()
    pad = b"\0" * max(0, 60 - 14 - _PAYLOAD.size)
    batch = turns_per_wakeup(len(socks), interval_us)
    step_s = interval_us / 1e6 / max(len(socks), 1) * batch
    stop = time.monotonic() + duration_s
    turn = 0
    print("sending", flush=True)
    next_t = time.monotonic()
    while next_t < stop and not (stop_flag and stop_flag[0]):
        for _ in range(batch):
            i = turn % len(socks)
            sock, header = socks[i]
            if ports[i].busy():
                stats.skipped += 1
            else:
                with contextlib.suppress(OSError):  # a port whose link is down (a fault)
                    sock.send(header + _PAYLOAD.pack(MAGIC, stream, turn // len(socks),
                                                     time.time()) + pad)
                    ports[i].probes_since += 1
                    stats.sent += 1
            turn += 1
        next_t += step_s
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -0.05:
            next_t = time.monotonic()  # far behind: do not burst
    return stats.sent


def turns_per_wakeup(ports: int, interval_us: float) -> int:
    """Ports served at each wake-up of :func:`send_many`: one, unless that would wake it more
    than :data:`MAX_WAKEUPS_PER_S` times a second; then as few as keep within it, and no more
    than every port once. Each port is still probed once an interval (its brackets on the wire
    are unchanged); a wake-up of the Python loop costs more CPU than the frame it sends (16
    ports every 2 ms on loopback: 0.15 cores at 8,000 wake-ups a second, 0.05 at 1,000;
    docs/wire.md "Cheaper probes")."""
    per_s = max(1, ports) / (interval_us / 1e6)
    return max(1, min(ports, math.ceil(per_s / MAX_WAKEUPS_PER_S)))


def _open_counter(path: str | None) -> int | None:
    """An open packet counter file, or None (no path, or it cannot be opened: never busy)."""
    if not path:
        return None
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def record(intf: str, out: Path, duration_s: float | None = None) -> int:
    """Record frames on ``intf`` until SIGTERM (or ``duration_s``); write JSON lines to ``out``."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((intf, 0))
    sock.settimeout(0.05)
    stopping = False

    def _stop(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print("ready", flush=True)
    frames: list[Frame] = []
    deadline = time.monotonic() + duration_s if duration_s else None
    while not stopping and (deadline is None or time.monotonic() < deadline):
        try:
            data, ancdata, _flags, addr = sock.recvmsg(2048, 64)
        except TimeoutError:
            continue
        except InterruptedError:
            continue
        t_s = time.time()
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
                sec, nsec = struct.unpack("qq", payload[:16])
                t_s = sec + nsec / 1e9
        frames.append(parse_frame(data, t_s, addr[2] == PACKET_OUTGOING))
    with out.open("w") as fh:
        for f in frames:
            fh.write(json.dumps(f.to_json()) + "\n")
    return len(frames)


def load_frames(path: Path) -> list[Frame]:
    with path.open() as fh:
        return [Frame(**json.loads(line)) for line in fh if line.strip()]


def probe_arrivals(frames: Iterable[Frame], stream: int) -> list[tuple[float, int]]:
    """(receive time, seq) of incoming probe frames of ``stream``, in time order."""
    return sorted((f.t_s, f.seq) for f in frames
                  if not f.outgoing and f.stream == stream and f.seq is not None)


def dark_gaps_s(receivers: Sequence[Sequence[tuple[float, int]]]) -> list[float]:
    """Dark periods of a stream whose receiver changes at each reconfiguration.

    ``receivers[i]`` are the arrivals at receiver ``i``. Merging them in time order gives runs
    of one receiver; each change of receiver is one reconfiguration, and its dark period is the
    time from the last frame of the old run to the first frame of the new one.
    """
    merged = sorted((t, i) for i, arrivals in enumerate(receivers) for t, _ in arrivals)
    gaps = []
    for (t0, r0), (t1, r1) in itertools.pairwise(merged):
        if r0 != r1:
            gaps.append(t1 - t0)
    return gaps


def missing_seqs(arrivals: Sequence[tuple[float, int]]) -> list[int]:
    """Sequence numbers lost between the first and last arrival."""
    seqs = sorted({s for _, s in arrivals})
    if not seqs:
        return []
    have = set(seqs)
    return [s for s in range(seqs[0], seqs[-1] + 1) if s not in have]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulator.probe",
                                     description="Data-plane probe stream and frame recorder.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("send", help="send a numbered, timestamped frame stream")
    s.add_argument("--intf", required=True)
    s.add_argument("--interval-us", type=float, default=100.0)
    s.add_argument("--duration-s", type=float, required=True)
    s.add_argument("--stream", type=int, default=1)
    s.add_argument("--dst-mac", default="ff:ff:ff:ff:ff:ff")
    m = sub.add_parser("send-many", help="send probe frames from several interfaces, each in "
                       "its own network namespace, from one process")
    m.add_argument("--target", action="append", required=True, metavar="NETNS:INTF",
                   help="a namespace path (e.g. /proc/PID/ns/net) and an interface in it")
    m.add_argument("--interval-us", type=float, default=1000.0)
    m.add_argument("--duration-s", type=float, required=True)
    m.add_argument("--stream", type=int, default=1)
    m.add_argument("--counter", action="append", default=None, metavar="PATH",
                   help="a packet counter file of each target's port, in --target order "
                   "(e.g. the bridge side's /sys/class/net/IF/statistics/rx_packets): a port "
                   "whose counter grew by more than its probes since its last turn carried "
                   "data, and is not probed that turn; '-' for none")
    r = sub.add_parser("record", help="record every frame on an interface until SIGTERM")
    r.add_argument("--intf", required=True)
    r.add_argument("--out", required=True, type=Path)
    r.add_argument("--duration-s", type=float, default=None)
    args = parser.parse_args(argv)
    if args.cmd == "send":
        n = send(args.intf, args.interval_us, args.duration_s, args.stream, args.dst_mac)
        print(json.dumps({"sent": n}), flush=True)
    elif args.cmd == "send-many":
        targets = [tuple(t.rsplit(":", 1)) for t in args.target]
        if any(len(t) != 2 for t in targets):
            parser.error("--target takes NETNS:INTF")
        counters = ([None if c == "-" else c for c in args.counter]
                    if args.counter is not None else None)
        if counters is not None and len(counters) != len(targets):
            parser.error(f"{len(counters)} --counter for {len(targets)} --target")
        stats, stop_flag = SendStats(), [False]

        def _stop(_sig: int, _frame: object) -> None:
            stop_flag[0] = True

        signal.signal(signal.SIGTERM, _stop)  # stop, then say what was sent
        send_many(targets, args.interval_us, args.duration_s, args.stream, counters, stats,
                  stop_flag)
        print(json.dumps(stats.to_json()), flush=True)
    else:
        n = record(args.intf, args.out, args.duration_s)
        print(json.dumps({"recorded": n}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
