"""Watch every place an emulated run can lose a frame, from outside the run (issue 35).

    python scripts/drop_watch.py OUT.jsonl [PERIOD_S [PID]]   # until SIGINT/SIGTERM
    python scripts/drop_watch.py summary OUT.jsonl [NAME...]  # what grew while the run was up

Each ``PERIOD_S`` (default 0.5) it appends one JSON line with, where it can read them:

* ``softnet``: the kernel's per-CPU backlog drops (``/proc/net/softnet_stat``, 2nd column),
  summed: a full ``netdev_max_backlog`` drops frames between a veth and its reader;
* ``tc``: per interface of the root namespace (the bridges' ports), the qdisc's ``dropped`` and
  ``overlimits`` (HTB, :mod:`emulator.shaping`);
* ``ranks``: per Mininet host (``mininet:NAME`` shells), its namespace's ``TcpExt``/``Tcp``
  counters that name a drop, a timer or a reordering (``ListenOverflows``, ``ListenDrops``,
  ``TCPReqQFullDrop``, ``TCPBacklogDrop``, ``TCPTimeouts``, ``TCPSynRetrans``,
  ``TCPDSACKRecv``, ...) and each interface's rx/tx drops (``/proc/PID/net/...``), and its
  qdiscs' drops (``tc`` run in its network namespace through ``nsenter``);
* ``dev``: the root namespace's interface drops (``/proc/net/dev``: the bridges' ports);
* ``ovs``: per private ``ovs-vswitchd`` (its ``--unixctl`` socket), the coverage counters that
  name a drop or an upcall (``coverage/show``) and ``dpctl/show``'s hits, misses and ``lost``;
* ``links``: the root namespace's interface names by ifindex (a ``tcpdump -i any`` capture
  names ports by ifindex only).

It sees every run on the machine (names carry each run's prefix) and changes none, except
that with ``PID`` (the ``opus-testbed`` process of the run under study) the vswitchds that
process started log every datapath flow they install, change or delete (``dpif`` and
``dpif_netdev`` at debug level) into that run's ``emulator/ovs-<bridge>.log``.

``summary`` prints the counters that grew between the first and the last line that saw them,
with the time of each growth (to set against a stalled call's acknowledgement); the busiest
ones (forwarding, upcalls, ``TCPFastRetrans``, ...) only when a ``NAME`` given matches them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RANK_COUNTERS = ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies",
                 "TCPBacklogDrop", "TCPTimeouts", "TCPSynRetrans", "TCPFastRetrans",
                 "TCPLossProbes", "TCPAbortOnTimeout", "TCPMinTTLDrop", "PAWSEstabRejected",
                 "TCPTimeWaitOverflow", "OutRsts", "InErrs", "AttemptFails", "EstabResets",
                 "TCPAbortOnData", "TCPAbortOnClose", "TCPSpuriousRTOs",
                 # a fast retransmission of a segment that was not lost (reordering)
                 "TCPDSACKRecv", "TCPDSACKUndo", "TCPSACKReorder", "TCPTSReorder",
                 "TCPRenoReorder", "TCPLostRetransmit", "RetransSegs")
OVS_COUNTERS = ("datapath_drop_upcall_error", "datapath_drop_lock_error",
                "datapath_drop_userspace_action_error", "datapath_drop_invalid_port",
                "datapath_drop_invalid_bond", "datapath_drop_invalid_tnl_port",
                "datapath_drop_recirc_error", "datapath_drop_sample_error",
                "datapath_drop_meter", "drop_action_of_pipeline", "drop_action_no_route",
                "upcall_flow_limit_hit", "upcall_ukey_contention", "upcall_ukey_replace",
                "handler_duplicate_upcall", "dpif_flow_put_error", "dpif_execute_error",
                "netdev_sent", "netdev_received", "dpif_flow_flush", "dpif_flow_del",
                "dpif_flow_put", "revalidate_missed_dp_flow", "ukey_dp_change",
                "upcall_ukey_contention", "xlate_actions", "dumped_duplicate_flow",
                "dumped_new_flow", "rev_flow_table", "rev_reconfigure", "netdev_get_stats")


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _pairs(text: str) -> dict[str, int]:
    """Counters of ``/proc/net/snmp``-style text (names line, values line)."""
    out: dict[str, int] = {}
    lines = text.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        for name, value in zip(names.split()[1:], values.split()[1:], strict=False):
            if name in RANK_COUNTERS:
                out[name] = int(value)
    return out


def _dev_drops(text: str) -> dict[str, list[int]]:
    """Per interface of ``/proc/net/dev``: [rx_packets, rx_drop, tx_packets, tx_drop]."""
    out: dict[str, list[int]] = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        f = rest.split()
        if len(f) >= 12:
            out[name.strip()] = [int(f[1]), int(f[3]), int(f[9]), int(f[11])]
    return out


def softnet() -> int:
    return sum(int(line.split()[1], 16) for line in _read("/proc/net/softnet_stat").splitlines()
               if line.strip())


def tc_root(pid: int | None = None) -> dict[str, list[int]]:
    """Root qdisc of each interface of the root namespace (or of ``pid``'s, read by ``tc`` run
    in it through ``nsenter``): [sent packets, dropped, overlimits]."""
    cmd = ["tc", "-s", "qdisc", "show"]
    if pid is not None:
        cmd = ["nsenter", f"--net=/proc/{pid}/ns/net", *cmd]
    try:
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    out: dict[str, list[int]] = {}
    dev = ""
    for line in text.splitlines():
        m = re.match(r"qdisc \S+ \S+ dev (\S+) root", line)
        if m:
            dev = m.group(1)
            continue
        m = re.search(r"Sent \d+ bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", line)
        if m and dev:
            out[dev] = [int(m.group(1)), int(m.group(2)), int(m.group(3))]
            dev = ""
    return out


def mininet_hosts() -> dict[str, int]:
    out: dict[str, int] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        cmd = _read(f"/proc/{pid}/cmdline").split("\0")
        if cmd and cmd[0].endswith("bash") and "-is" in cmd:
            name = cmd[-2] if cmd[-1] == "" else cmd[-1]
            if name.startswith("mininet:"):
                out[name[len("mininet:"):]] = int(pid)
    return out


def _descends(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        stat = _read(f"/proc/{pid}/stat")
        if not stat:
            return False
        pid = int(stat.rpartition(")")[2].split()[1])
    return False


def vswitchd_sockets(root: int | None = None) -> list[str]:
    """The ``--unixctl`` sockets of the private vswitchds (those started by ``root``'s process
    tree only, when given)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        cmd = _read(f"/proc/{pid}/cmdline").split("\0")
        if cmd and cmd[0].endswith("ovs-vswitchd") and (root is None
                                                        or _descends(int(pid), root)):
            out += [a.split("=", 1)[1] for a in cmd if a.startswith("--unixctl=")]
    return out


def ovs(ctl: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = subprocess.run(["ovs-appctl", "-t", ctl, "coverage/show"], capture_output=True,
                              text=True, timeout=5).stdout
        for line in text.splitlines():
            m = re.match(r"(\S+)\s+.*total: (\d+)", line)
            if m and m.group(1) in OVS_COUNTERS:
                out[m.group(1)] = int(m.group(2))
        text = subprocess.run(["ovs-appctl", "-t", ctl, "dpctl/show"], capture_output=True,
                              text=True, timeout=5).stdout
        m = re.search(r"lookups: hit:(\d+) missed:(\d+) lost:(\d+)", text)
        if m:
            out["dp_hit"], out["dp_missed"], out["dp_lost"] = map(int, m.groups())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def links() -> dict[int, str]:
    """ifindex -> name of the root namespace's interfaces (a capture on ``any`` names ports by
    ifindex only)."""
    out: dict[int, str] = {}
    for name in os.listdir("/sys/class/net"):
        text = _read(f"/sys/class/net/{name}/ifindex").strip()
        if text.isdigit():
            out[int(text)] = name
    return out


def snapshot() -> dict[str, Any]:
    ranks = {}
    for name, pid in mininet_hosts().items():
        counters = (_pairs(_read(f"/proc/{pid}/net/snmp"))
                    | _pairs(_read(f"/proc/{pid}/net/netstat")))
        devs = {d: v for d, v in _dev_drops(_read(f"/proc/{pid}/net/dev")).items() if d != "lo"}
        ranks[name] = {"tcp": counters, "dev": devs, "tc": tc_root(pid)}
    root_devs = {d: v for d, v in _dev_drops(_read("/proc/net/dev")).items() if d != "lo"}
    return {"t": time.time(), "softnet": softnet(), "tc": tc_root(), "dev": root_devs,
            "ranks": ranks,
            "ovs": {ctl: ovs(ctl) for ctl in vswitchd_sockets()}, "links": links()}


def log_flow_ops(ctl: str) -> None:
    """Make a vswitchd log every datapath flow it installs, changes or deletes (``dpif`` and
    ``dpif_netdev`` at debug level, to its log file only): which flow dropped a frame, and when
    it came and went, is then in the run's ``emulator/ovs-<bridge>.log``."""
    for module in ("dpif", "dpif_netdev"):
        subprocess.run(["ovs-appctl", "-t", ctl, "vlog/set", f"{module}:file:dbg"],
                       capture_output=True, timeout=5, check=False)


def watch(out: Path, period_s: float, flow_log_root: int | None = None) -> None:
    seen: set[str] = set()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with out.open("a") as fh:
        try:
            while not stop:
                if flow_log_root is not None:
                    for ctl in set(vswitchd_sockets(flow_log_root)) - seen:
                        log_flow_ops(ctl)
                        seen.add(ctl)
                fh.write(json.dumps(snapshot()) + "\n")
                fh.flush()
                time.sleep(period_s)
        except KeyboardInterrupt:
            pass


def _flatten(snap: dict[str, Any]) -> dict[str, int]:
    flat = {"softnet.dropped": snap["softnet"]}
    for dev, (_sent, dropped, over) in snap["tc"].items():
        flat[f"tc.{dev}.dropped"] = dropped
        flat[f"tc.{dev}.overlimits"] = over
    for dev, (_rx, rxd, _tx, txd) in snap.get("dev", {}).items():
        flat[f"dev.{dev}.rx_drop"] = rxd
        flat[f"dev.{dev}.tx_drop"] = txd
    for host, rec in snap["ranks"].items():
        for dev, (_sent, dropped, _over) in rec.get("tc", {}).items():
            flat[f"{host}.tc.{dev}.dropped"] = dropped
        for name, v in rec["tcp"].items():
            flat[f"{host}.{name}"] = v
        for dev, (_rx, rxd, _tx, txd) in rec["dev"].items():
            flat[f"{host}.{dev}.rx_drop"] = rxd
            flat[f"{host}.{dev}.tx_drop"] = txd
    for ctl, rec in snap["ovs"].items():
        tag = Path(ctl).parent.name or ctl
        for name, v in rec.items():
            flat[f"ovs.{tag}.{name}"] = v
    return flat


def summary(path: Path, show: tuple[str, ...] = ()) -> None:
    first: dict[str, tuple[float, int]] = {}
    last: dict[str, tuple[float, int]] = {}
    grew: dict[str, list[tuple[float, int]]] = {}
    for line in path.read_text().splitlines():
        snap = json.loads(line)
        for key, v in _flatten(snap).items():
            if key not in first:
                first[key] = (snap["t"], v)
            elif v != last[key][1]:
                grew.setdefault(key, []).append((snap["t"], v - last[key][1]))
            last[key] = (snap["t"], v)
    quiet = ("netdev_sent", "netdev_received", "xlate_actions", "dp_hit", "dp_missed",
             "dpif_flow_put", "dpif_flow_del", "dpif_flow_flush", "overlimits", "netdev_get_stats",
             "rev_flow_table", "dumped_new_flow", "revalidate_missed_dp_flow",
             "TCPFastRetrans", "OutRsts", "ukey_dp_change", "dumped_duplicate_flow")
    for key in sorted(grew):
        if any(q in key for q in quiet) and not any(s in key for s in show):
            continue
        steps = ", ".join(f"{t:.3f}:+{d}" for t, d in grew[key][:8])
        print(f"{key:48s} +{last[key][1] - first[key][1]:6d}  {steps}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "summary":
        summary(Path(sys.argv[2]), tuple(sys.argv[3:]))
    elif len(sys.argv) in (2, 3, 4):
        watch(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) >= 3 else 0.5,
              int(sys.argv[3]) if len(sys.argv) == 4 else None)
    else:
        sys.exit(__doc__)
