"""One Open vSwitch per rail (emulator.ovs_instance) on real OVS and Mininet: each rail's flows
live in its own vswitchd, bytes cross a switched circuit, teardown leaves no daemon or
directory of the instances."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from emulator import naming, runstate
from emulator.network import EmulatedRails, emulated_rails
from emulator.topo import RailSpec
from emulator.vswitchd_priority import VSWITCHD_PRIORITY

SIZE_BYTES = 2_000_000
RECEIVER = ("import socket,sys\n"
            "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind((sys.argv[1], 5301)); s.listen(1); print('listening', flush=True)\n"
            "c,_=s.accept(); n=0\n"
            "while (b:=c.recv(65536)): n+=len(b)\n"
            "print(n, flush=True)\n")
SENDER = ("import socket,sys; c=socket.create_connection((sys.argv[1], 5301), timeout=30); "
          f"c.sendall(bytes({SIZE_BYTES})); c.close()")


def flows(net: EmulatedRails, bridge: str) -> str:
    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows",
                           net.ofctl_target(bridge)],
                          capture_output=True, text=True, check=True).stdout


def send_bytes(net: EmulatedRails, src: int, dst: int) -> int:
    """Bytes ``dst`` received of :data:`SIZE_BYTES` that ``src`` sent over TCP."""
    rx = net.popen(dst, [sys.executable, "-c", RECEIVER, net.rank_address(dst)], text=True)
    assert rx.stdout is not None
    assert rx.stdout.readline().strip() == "listening"
    net.cmd(src, f"{sys.executable} -c \"{SENDER}\" {net.rank_address(dst)}")
    out, _ = rx.communicate(timeout=30)
    return int(out.strip())


def test_each_rail_in_its_own_vswitchd(tmp_path: Path, no_leftovers: list[str]) -> None:
    spec = RailSpec(servers=2, gpus_per_server=2, link_mbps=100)  # 2 rails of 2 ports
    with emulated_rails(spec, run_dir=tmp_path, ovs_per_rail=True) as net:
        no_leftovers.append(net.prefix)
        assert net.ovs == "per-rail" and net.instances is not None
        pids = net.vswitchd_pids
        paths = dict(net.instances.paths)
        bridges = [naming.rail_bridge(net.prefix, r) for r in range(2)]
        assert sorted(paths) == bridges and len(set(pids)) == 2
        for pid in pids:
            assert os.sched_getscheduler(pid) == os.SCHED_FIFO
            assert os.sched_getparam(pid).sched_priority == VSWITCHD_PRIORITY
        recorded = {p.pid for p in net.record.processes}
        assert set(pids) <= recorded, "instances are not in the run record"
        system = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True,
                                text=True, check=False).stdout.split()
        assert not set(bridges) & set(system), "a rail bridge landed in the system instance"

        a, b = 0, 2  # both on rail 0 (local GPU 0 of servers 0 and 1)
        net.driver.apply(0, add=[(net.port(a), net.port(b))])
        assert f"in_port={net.port(a)} actions=output:{net.port(b)}" in flows(net, bridges[0])
        assert "actions=output" not in flows(net, bridges[1]), "rail 1 got rail 0's circuit"
        assert send_bytes(net, a, b) == SIZE_BYTES
        # the rail worker switched over its instance's socket, and purged its datapath there
        events = [json.loads(line) for line in
                  (tmp_path / "ocs-events.jsonl").read_text().splitlines()]
        channels = [e for e in events if e["event"] == "channel"]
        assert [e.get("path") for e in channels] == [str(paths[bridges[0]].mgmt_socket)]
        log = (tmp_path / "ocs-service.log").read_text()
        assert "datapath flush failed" not in log, log
    for paths_one, pid in zip(paths.values(), pids, strict=True):
        assert not runstate.pid_alive(pid) or paths_one.marker not in runstate.cmdline(pid)
        assert not paths_one.directory.exists(), f"{paths_one.directory} left behind"
    assert not (tmp_path / "ovs").exists()
