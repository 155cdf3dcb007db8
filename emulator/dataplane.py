"""Traffic on the emulated rails, for the benchmarks, the demo and the tests.

Every process starts inside a rank's namespace through :meth:`EmulatedRails.popen` (so teardown
stops it by pid) and is waited for by its own readiness line or by polling, never by sleeping.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from emulator.network import EmulatedRails, wait_for
from emulator.probe import Frame, load_frames


class Recorders:
    """Frame recorders on chosen interfaces of chosen ranks (``with`` stops and loads them)."""

    def __init__(self, net: EmulatedRails, intfs: Mapping[int, Sequence[str]],
                 out_dir: Path) -> None:
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        self._procs: dict[tuple[int, str], subprocess.Popen[Any]] = {}
        for rank, names in intfs.items():
            for intf in names:
                self._procs[(rank, intf)] = net.popen(
                    rank, [sys.executable, "-m", "emulator.probe", "record", "--intf", intf,
                           "--out", str(self._path(rank, intf))])
        for (rank, intf), proc in self._procs.items():
            assert proc.stdout is not None
            line = proc.stdout.readline().decode().strip()
            if line != "ready":
                err = proc.stderr.read().decode()[-300:] if proc.stderr else ""
                raise RuntimeError(f"recorder on rank {rank} {intf} failed: {line} {err}")
        self.frames: dict[tuple[int, str], list[Frame]] = {}

    def _path(self, rank: int, intf: str) -> Path:
        return self.out_dir / f"frames-rank{rank}-{intf}.jsonl"

    def stop(self) -> dict[tuple[int, str], list[Frame]]:
        """Stop every recorder and load what each saw."""
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
        for key, proc in self._procs.items():
            proc.wait(timeout=10)
            self.frames[key] = load_frames(self._path(*key))
        return self.frames

    def __enter__(self) -> Recorders:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.frames:
            self.stop()


def start_stream(net: EmulatedRails, rank: int, intf: str, duration_s: float,
                 interval_us: float = 100.0, stream: int = 1) -> subprocess.Popen[Any]:
    """Start a probe stream from ``rank``'s ``intf``; returns once frames are flowing."""
    proc = net.popen(rank, [sys.executable, "-m", "emulator.probe", "send", "--intf", intf,
                            "--interval-us", str(interval_us), "--duration-s", str(duration_s),
                            "--stream", str(stream)])
    assert proc.stdout is not None
    if proc.stdout.readline().decode().strip() != "sending":
        err = proc.stderr.read().decode()[-300:] if proc.stderr else ""
        raise RuntimeError(f"probe sender on rank {rank} failed: {err}")
    return proc


def ping_ok(net: EmulatedRails, src: int, dst: int, count: int = 1) -> bool:
    """True if at least one of ``count`` pings from ``src`` reaches ``dst``'s rank address."""
    out = net.cmd(src, f"ping -c{count} -i0.2 -W1 -q {net.rank_address(dst)}")
    m = re.search(r"(\d+) received", out)
    return bool(m and int(m.group(1)) > 0)


def tcp_transfer_mbps(net: EmulatedRails, client: int, server: int,
                      seconds: int = 1, port: int = 5201) -> float:
    """A real TCP transfer with iperf3 between two ranks; returns the goodput in Mbit/s."""
    addr = net.rank_address(server)
    srv = net.popen(server, ["iperf3", "-s", "-1", "-B", addr, "-p", str(port)])
    try:
        def listening() -> bool:
            return f":{port}" in net.cmd(server, f"ss -Hltn 'sport = :{port}'")

        wait_for(listening, 10, f"iperf3 server on rank {server}")
        # iperf3 reads -t as an integer, and -t 0 means "forever": whole seconds only.
        out = net.cmd(client, f"iperf3 -c {addr} -p {port} -t {max(1, int(seconds))} -J")
        data = json.loads(out[out.index("{"):])
        if "error" in data:
            raise RuntimeError(f"iperf3 rank {client} -> rank {server}: {data['error']}")
        return float(data["end"]["sum_received"]["bits_per_second"]) / 1e6
    finally:
        if srv.poll() is None:
            srv.terminate()
        srv.wait(timeout=5)
