"""An observer of the emulated OCS that the OCS app does not control: tcpdump on its ports.

``with wire_capture(net, out_dir) as cap:`` starts one ``tcpdump`` per port of every OCS rail
bridge, on the switch side (the bridge port interface in the root namespace), writing frame
heads (:data:`SNAP_BYTES`) with kernel timestamps to ``out_dir/<interface>.pcap``. With
``probe_interval_ms`` every rank's and spare's rail interface also sends a low-rate stream of
probe frames (:mod:`emulator.probe`), so that a port is observed across a switch even when its
rank has nothing to send; a port that carried data since its last turn is not probed that turn
(its data frames mark its circuit's edges: :func:`probe_counters`). Spares' ports are captured
and probed too: when a spare takes a rank over its NIC takes the rank's addresses, which the
analysis follows from the runner's takeover record. On the way out the senders and captures
are stopped (by pid, SIGTERM: tcpdump then flushes its file and prints its counters; the
sender its frames sent and skipped), and :attr:`WireCapture.ports` and each
capture's kernel drop count are written to ``out_dir/wire.json``: what the analysis
(:mod:`testbed.metrics.wire`) needs besides the pcap files, i.e. which port each interface is,
which rank sits behind it, and its NIC's address (a frame whose source is that address entered
the switch there; any other left the switch there).

Under rail-state (the data rails electrical, the bits switching on shadow rails) the captured
ports are the shadow rails' instead: each is a veth whose far end sits in the run's shadow
namespace (:mod:`emulator.shadowports`), and the probes are sent from those far ends, so that
every shadow switch is observed like a data rail's (:func:`captured_ports`, :func:`probe_targets`).

Every process is recorded in the run's record, so ``opus-testbed clean`` stops it after a crash.
Pure parsing of tcpdump's closing counters is :func:`parse_tcpdump_stats`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from emulator import naming, runstate, shadowports

if TYPE_CHECKING:
    from emulator.network import EmulatedRails

#: Bytes of each frame kept: Ethernet (14) + IPv4 (20) + TCP (20, + options) heads, and the
#: probe frames' stream and sequence numbers (14 + 20). Enough to tell frames apart.
SNAP_BYTES = 64
#: Default (and shortest) interval of the probe streams that keep idle ports observed (ms of
#: wall time): the wire's dark periods are known to within about this much
#: (:mod:`testbed.metrics.wire`).
PROBE_INTERVAL_MS = 0.5
#: The longest probe interval (ms), and the share of the shortest switching delay the interval
#: may reach (:func:`probe_interval_ms`): every probe frame costs the userspace switch a
#: forwarding and each capture a copy, so a 100 ms delay, which needs no 0.5 ms resolution,
#: probes every 2 ms (docs/wire.md, "Cost").
PROBE_INTERVAL_MAX_MS = 2.0
PROBE_SHARE_OF_DELAY = 0.02
#: Probe frames a second over every probed port at most: the demo's 16 ports every 2 ms, with
#: which its rows stayed `ok` on a quiet 2-core machine. Its 32 ports at K = 2 every 2 ms cost
#: the row its `ok` (the capture and the four vswitchds 1.5 cores; docs/wire.md, "Cost"), so
#: more ports probe less often: the interval grows past :data:`PROBE_INTERVAL_MAX_MS` with them.
PROBE_BUDGET_FPS = 8000.0
#: The probe frames' stream id (the rank's own number is not needed: the source address says it).
PROBE_STREAM = 37
#: Per-capture kernel buffer (KiB): a 100 ms burst at 1 Gbit/s of 64-byte heads fits easily.
BUFFER_KIB = 4096


class WireCaptureError(RuntimeError):
    """A capture could not be started."""


@dataclass(frozen=True)
class CapturedPort:
    """One OCS port as the capture sees it."""

    rail: int
    port: int
    intf: str  # the bridge port interface (switch side) that tcpdump listens on
    host: int  # the rank (or spare host) whose NIC is attached; -1: a shadow port's far end
    mac: str  # that NIC's address


@dataclass
class WireCapture:
    """What a run's capture recorded (valid after the ``with`` block)."""

    out_dir: Path
    ports: list[CapturedPort]
    probe_interval_ms: float | None
    delays_ms: dict[int, float] = field(default_factory=dict)  # rail -> delay on the wire
    kernel_drops: dict[str, int] = field(default_factory=dict)  # interface -> frames
    errors: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # the captures' and the probe sender's
    probe_frames: dict[str, int] = field(default_factory=dict)  # "sent", "skipped" (busy)

    def to_json(self) -> dict[str, Any]:
        return {"snap_bytes": SNAP_BYTES, "probe_interval_ms": self.probe_interval_ms,
                "probe_stream": PROBE_STREAM, "ports": [asdict(p) for p in self.ports],
                "delays_ms": {str(r): d for r, d in self.delays_ms.items()},
                "probe_frames": self.probe_frames, "kernel_drops": self.kernel_drops,
                "errors": self.errors}


def captured_ports(net: EmulatedRails) -> list[CapturedPort]:
    """The ports the capture watches: every port of every OCS data rail with the NIC behind
    it (ranks' and spares'), or under rail-state (electrical data rails) every shadow port."""
    spec = net.spec
    if spec.mode != "ocs":
        return shadow_captured_ports(net.prefix, spec.shadow_ids)
    return [CapturedPort(p.rail, p.port, naming.bridge_port_intf(net.prefix, p.rail, p.port),
                         host, _host_mac(spec.num_ranks, host, p.port_index))
            for host in range(spec.num_hosts) for p in spec.host_ports(host)]


def shadow_captured_ports(prefix: str, shadow_ids: Iterable[int]) -> list[CapturedPort]:
    """Every shadow port (rail-state) as the capture sees it: its bridge side, and its far
    end's address (a frame from it entered the shadow switch there)."""
    return [CapturedPort(rail, port, naming.shadow_port_intf(prefix, rail, port), -1,
                         naming.shadow_mac(rail, port))
            for rail, port in shadowports.shadow_port_ids(shadow_ids)]


def probe_targets(net: EmulatedRails) -> list[tuple[str, str]]:
    """(namespace path, interface) of every probe sender: every rank's and spare's rail ports,
    or under rail-state every shadow port's far end (the ranks' rail ports then lead to
    electrical rails, which nothing switches). A spare's port is dark (no circuit: its probes
    are dropped) until the spare takes a rank over; from then on its probes time its circuits
    like a rank's. They keep the spare's own address: the analysis follows the port's change
    of address (:func:`testbed.metrics.wire.port_macs`)."""
    spec = net.spec
    if spec.mode != "ocs":
        return shadowports.probe_targets(net.prefix, spec.shadow_ids)
    return [(f"/proc/{net.node(host).pid}/ns/net",
             spec.host_rail_intf(net.prefix, host, p.port_index))
            for host in range(spec.num_hosts) for p in spec.host_ports(host)]


def probe_counters(net: EmulatedRails) -> list[str]:
    """The packet counter of each probe target's port, in :func:`probe_targets`' order: the
    bridge side's ``rx_packets`` (root namespace), which counts every frame the target sent
    into the switch. The sender skips a port's probe when it carried data since its last turn
    (:class:`emulator.probe.BusyPort`)."""
    spec = net.spec
    if spec.mode != "ocs":
        intfs = [p.intf for p in shadow_captured_ports(net.prefix, spec.shadow_ids)]
    else:
        intfs = [naming.bridge_port_intf(net.prefix, p.rail, p.port)
                 for host in range(spec.num_hosts) for p in spec.host_ports(host)]
    return [f"/sys/class/net/{intf}/statistics/rx_packets" for intf in intfs]


def _host_mac(num_ranks: int, host: int, port_index: int) -> str:
    if host < num_ranks:
        return naming.rail_mac(host, port_index)
    return naming.spare_rail_mac(host - num_ranks, port_index)


def probe_interval_ms(shortest_delay_ms: float, probe_ports: int = 1) -> float:
    """The probe interval for a run whose shortest switching delay (wall time) is
    ``shortest_delay_ms``: :data:`PROBE_SHARE_OF_DELAY` of it, within
    [:data:`PROBE_INTERVAL_MS`, :data:`PROBE_INTERVAL_MAX_MS`], and no shorter than
    ``probe_ports`` (ports that send probes: :func:`probe_targets`) allow under
    :data:`PROBE_BUDGET_FPS`."""
    by_delay = min(PROBE_INTERVAL_MAX_MS, max(PROBE_INTERVAL_MS,
                                              PROBE_SHARE_OF_DELAY * shortest_delay_ms))
    return max(by_delay, 1e3 * max(1, probe_ports) / PROBE_BUDGET_FPS)


_STATS_RE = re.compile(r"(\d+) packets? (captured|received by filter|dropped by kernel)")


def parse_tcpdump_stats(stderr: str) -> dict[str, int]:
    """tcpdump's closing counters: ``captured``, ``received by filter``, ``dropped by kernel``."""
    return {m.group(2): int(m.group(1)) for m in _STATS_RE.finditer(stderr)}


def tcpdump_command(intf: str, path: Path) -> list[str]:
    """The capture of one switch port: frame heads, no name look-ups, nanosecond stamps,
    each frame handed over at once and written as it comes (without ``--immediate-mode`` the
    kernel holds frames in its ring for up to a second, and a stop loses them)."""
    return ["tcpdump", "-i", intf, "-s", str(SNAP_BYTES), "-B", str(BUFFER_KIB), "-n",
            "-U", "--immediate-mode", "--time-stamp-precision=nano", "-w", str(path)]


@contextlib.contextmanager
def wire_capture(net: EmulatedRails, out_dir: Path, *, probe_interval_ms: float | None =
                 PROBE_INTERVAL_MS, delays_ms: dict[int, float] | None = None,
                 ready_timeout_s: float = 10.0) -> Iterator[WireCapture]:
    """Capture every OCS port of ``net`` into ``out_dir`` while the block runs (see module)."""
    if shutil.which("tcpdump") is None:
        raise WireCaptureError("tcpdump is not installed (apt-get install tcpdump), and the wire "
                               "check needs it; or set run.wire_check: off")
    out_dir.mkdir(parents=True, exist_ok=True)
    cap = WireCapture(out_dir, captured_ports(net), probe_interval_ms, dict(delays_ms or {}))
    dumps: dict[str, subprocess.Popen[bytes]] = {}
    senders: list[subprocess.Popen[Any]] = []
    try:
        for port in cap.ports:
            cmd = tcpdump_command(port.intf, out_dir / f"{port.intf}.pcap")
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            net.record.add_process(proc.pid, " ".join(cmd))
            cap.pids.append(proc.pid)
            dumps[port.intf] = proc
        _wait_listening(dumps, ready_timeout_s)
        if probe_interval_ms:
            cmd = [sys.executable, "-m", "emulator.probe", "send-many",
                   "--interval-us", str(probe_interval_ms * 1e3), "--duration-s", "86400",
                   "--stream", str(PROBE_STREAM)]
            cmd += [f"--target={ns}:{intf}" for ns, intf in probe_targets(net)]
            cmd += [f"--counter={c}" for c in probe_counters(net)]
            sender = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=_child_env())
            net.record.add_process(sender.pid, "emulator.probe send-many")
            cap.pids.append(sender.pid)
            senders.append(sender)
            assert sender.stdout is not None
            if not _ready_line(sender.stdout, b"sending", ready_timeout_s):
                err = sender.stderr.read().decode()[-300:] if sender.stderr else ""
                raise WireCaptureError(f"the wire check's probe sender failed: {err}")
        yield cap
    finally:
        for proc in senders:
            if proc.poll() is None:
                proc.terminate()
        for proc in senders:
            cap.probe_frames.update(_sender_counts(proc))
        for proc in dumps.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for intf, proc in dumps.items():
            try:
                raw = proc.communicate(timeout=10)[1]
            except subprocess.TimeoutExpired:
                runstate.stop_process(proc.pid, "tcpdump")
                raw = proc.communicate(timeout=5)[1]
                cap.errors.append(f"{intf}: tcpdump did not stop on SIGTERM")
            err = raw.decode(errors="replace")
            stats = parse_tcpdump_stats(err)
            if "captured" not in stats:
                cap.errors.append(f"{intf}: tcpdump printed no counters: {err[-200:].strip()}")
            cap.kernel_drops[intf] = stats.get("dropped by kernel", 0)
        (out_dir / "wire.json").write_text(json.dumps(cap.to_json(), indent=1))


def _sender_counts(proc: subprocess.Popen[Any]) -> dict[str, int]:
    """The probe sender's closing line (frames sent and skipped), once it stopped; {} when it
    printed none."""
    try:
        out = proc.communicate(timeout=5)[0] or b""
    except subprocess.TimeoutExpired:
        runstate.stop_process(proc.pid, "emulator.probe send-many")
        return {}
    for line in reversed(out.decode(errors="replace").splitlines()):
        with contextlib.suppress(ValueError):
            counts = json.loads(line)
            if isinstance(counts, dict) and "sent" in counts:
                return {k: int(v) for k, v in counts.items()}
    return {}


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    return env


def _ready_line(stream: IO[bytes], expected: bytes, timeout_s: float) -> bool:
    """True when ``stream``'s first line, read within ``timeout_s``, contains ``expected``."""
    ready, _, _ = select.select([stream], [], [], timeout_s)
    return bool(ready) and expected in stream.readline()


def _wait_listening(dumps: dict[str, subprocess.Popen[bytes]], timeout_s: float) -> None:
    """Wait until every tcpdump said it is listening (its first stderr line), or fail."""
    deadline = time.monotonic() + timeout_s
    for intf, proc in dumps.items():
        assert proc.stderr is not None
        left_s = max(0.0, deadline - time.monotonic())
        if not _ready_line(proc.stderr, b"listening on", left_s):
            proc.terminate()
            raise WireCaptureError(f"tcpdump on {intf} did not start listening in "
                                   f"{timeout_s:g} s (exit status {proc.poll()})")
