"""Benchmarks of the emulated OCS (JSON on stdout via ``opus-testbed bench``).

* ``fidelity``: the dark period as the data plane sees it. Rank 0 streams probe frames over one
  port while its circuit alternates between rank 1 and rank 2; the dark period of each switch is
  the time from the last frame at the old peer to the first frame at the new one (kernel receive
  timestamps). Reported per injected delay with its error (measured - injected), beside the
  error of the OCS app's own timestamps (``t_light - t_dark - delay``, what every emulated run
  checks: ``testbed.metrics.darktime``).
* ``control``: what a reconfiguration costs beyond its injected delay, measured inside the OCS
  app from request receipt to the confirming barrier: ``(t_light - t_request) - delay``.
* ``counters``: what the light's port counters cost the switch's answer, on one rail of the
  run's own Open vSwitch (no traffic), through the rail's OpenFlow connection as the OCS app's
  workers use it: a barrier alone, every port's counters with a barrier, and single-port
  counter requests for the ports a switch touches with a barrier (the app asks the latter).
* ``tcp``: how close TCP between two ranks comes to the shaped link rate: one way, both ways
  at once (a two-rank ring step) and both ways with the second flow starting late (into a busy
  reverse direction), each on a fresh connection as the replayer opens one per call. Each
  figure is a flow's time over the ideal (its bytes in full frames at the link rate). Three
  set-ups run side by side, their trials interleaved so that the machine's load hits them
  alike: the emulator's (links shaped with ACKs first, :mod:`emulator.shaping`, and the
  project's TCP queue cap, :func:`emulator.hostnet.tcp_queue_limit_bytes`), one FIFO per link
  (Mininet's ``TCLink`` shaping, the emulator before ACKs went first) and the kernel's default
  queue cap. ``slow_flows`` counts flows over :data:`SLOW_FLOW_RATIO` x ideal: the slow mode
  of the bimodal rates a FIFO gives two-way exchanges.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from controller.ocs import Circuit, Reconfiguration
from controller.stats import percentiles
from emulator.dataplane import Recorders, start_stream
from emulator.hostnet import tcp_queue_limit_bytes
from emulator.network import emulated_rails
from emulator.ofchannel import OFPP_ANY, OpenFlowChannel, barrier_request, port_stats_request
from emulator.probe import dark_gaps_s, probe_arrivals
from emulator.topo import RailSpec

Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def summary_ms(values_s: Sequence[float]) -> dict[str, float]:
    """p50, p99 (:func:`controller.stats.percentile`), max and mean of ``values_s``, in ms."""
    ms = [v * 1e3 for v in values_s]
    p50, p99 = percentiles(ms, (50, 99))
    return {"p50": round(p50, 3), "p99": round(p99, 3),
            "max": round(max(ms), 3), "mean": round(statistics.fmean(ms), 3)}


def run_fidelity_bench(delays_ms: Sequence[float] = (1, 5, 25, 100), switches: int = 20,
                       interval_us: float = 100.0, settle_ms: float = 15.0,
                       progress: Progress = _stderr) -> dict[str, Any]:
    """Measure data-plane dark periods for each injected delay."""
    spec = RailSpec(servers=3, gpus_per_server=1, ports_per_rank=1, link_mbps=None)
    results: list[dict[str, Any]] = []
    with emulated_rails(spec) as net:
        out_dir = net.run_dir / "fidelity"
        out_dir.mkdir(parents=True, exist_ok=True)
        p0, p1, p2 = net.port(0), net.port(1), net.port(2)
        for delay_ms in delays_ms:
            net.set_switching_delay_ms(0, delay_ms)
            net.driver.apply(0, add=[(p0, p1)])
            recorders = Recorders(net, {1: [net.rail_intf(1)], 2: [net.rail_intf(2)]},
                                  out_dir / f"delay{delay_ms:g}")
            sender = start_stream(net, 0, net.rail_intf(0), 3600, interval_us, stream=7)
            time.sleep(settle_ms / 1e3)  # light period before the first switch (pacing)
            peer = p1
            t_first = time.time()  # the OCS app's clock
            for _ in range(switches):
                new = p2 if peer == p1 else p1
                net.driver.apply_many([Reconfiguration.of(0, add=[(p0, new)],
                                                          remove=[Circuit(0, p0, peer)])])
                peer = new
                time.sleep(settle_ms / 1e3)  # light period between switches (pacing)
            time.sleep(settle_ms / 1e3)
            sender.terminate()
            sender.wait(timeout=10)
            frames = recorders.stop()
            arrivals = [probe_arrivals(frames[(1, net.rail_intf(1))], 7),
                        probe_arrivals(frames[(2, net.rail_intf(2))], 7)]
            gaps = dark_gaps_s(arrivals)
            if len(gaps) != switches:
                raise RuntimeError(f"delay {delay_ms} ms: saw {len(gaps)} receiver changes "
                                   f"for {switches} reconfigurations")
            errors = [g - delay_ms / 1e3 for g in gaps]
            lights = [e for e in _read_jsonl(net.run_dir / "ocs-events.jsonl")
                      if e.get("event") == "light" and float(e["t_dark_s"]) >= t_first]
            app = summary_ms([float(e["t_light_s"]) - float(e["t_dark_s"]) - delay_ms / 1e3
                              for e in lights])
            results.append({"delay_ms": delay_ms, "switches": switches,
                            "measured_ms": summary_ms(gaps), "error_ms": summary_ms(errors),
                            "app_error_ms": app})
            progress(f"fidelity: delay {delay_ms:g} ms -> measured p50 "
                     f"{results[-1]['measured_ms']['p50']} ms, p99 error "
                     f"{results[-1]['error_ms']['p99']} ms (OCS app's own: "
                     f"{app['p99']} ms)")
            net.driver.apply(0, remove=[Circuit(0, p0, peer)])
        datapath = net.datapath
    return {"benchmark": "fidelity", "probe_interval_us": interval_us, "datapath": datapath,
            "results": results}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_control_bench(port_counts: Sequence[int] = (8, 16, 64), repeats: int = 30,
                      delay_ms: float = 1.0, progress: Progress = _stderr) -> dict[str, Any]:
    """Measure the OCS app's overhead beyond the injected delay."""
    results: list[dict[str, Any]] = []
    for ports in port_counts:
        spec = RailSpec(servers=ports, gpus_per_server=1, ports_per_rank=1, link_mbps=None,
                        switching_delay=delay_ms)
        with emulated_rails(spec) as net:
            all_ports = [net.port(r) for r in range(ports)]
            # Two perfect matchings that share no circuit: (0,1)(2,3)... and (1,2)(3,4)...(n-1,0)
            even = [Circuit(0, all_ports[i], all_ports[i + 1]) for i in range(0, ports, 2)]
            odd = [Circuit(0, all_ports[i], all_ports[(i + 1) % ports])
                   for i in range(1, ports, 2)]
            net.driver.apply_many([Reconfiguration.of(0, add=even)])
            for label, count in (("one", 1), ("all", len(even))):
                overheads = []
                current, other = even, odd
                for _ in range(repeats):
                    if count == 1:
                        c = current[0]
                        res = net.driver.apply(0, remove=[c], add=[c])
                    else:
                        res = net.driver.apply(0, remove=current, add=other)
                        current, other = other, current
                    overheads.append((res.t_light_s - res.t_request_s) - delay_ms / 1e3)
                results.append({"ports": ports, "circuits_changed": count,
                                "overhead_ms": summary_ms(overheads)})
                progress(f"control: {ports} ports, {label} circuit(s) changed ({count}) -> "
                         f"p50 {results[-1]['overhead_ms']['p50']} ms")
    return {"benchmark": "control", "injected_delay_ms": delay_ms, "results": results}


def _counters_cases(all_ports: Sequence[int], touched: Sequence[int]) -> dict[str, list[int]]:
    """Each case's counter requests: none, one for every port (``OFPP_ANY``), one per port."""
    return {"barrier": [], "every_port": [OFPP_ANY],
            **{f"{n}_ports": list(all_ports[:n]) for n in touched}}


def run_counters_bench(ports: int = 16, touched: Sequence[int] = (2, 4), repeats: int = 300,
                       progress: Progress = _stderr) -> dict[str, Any]:
    """Round trip (ms) of a barrier, of every port's counters plus a barrier, and of one
    counters request per touched port plus a barrier, on rail 0 of a ``ports``-port network."""
    spec = RailSpec(servers=ports, gpus_per_server=1, ports_per_rank=1, link_mbps=None)
    with emulated_rails(spec) as net:
        channel = OpenFlowChannel(net.mgmt_socket(0))
        cases = _counters_cases([net.port(r) for r in range(ports)], touched)
        times: dict[str, list[float]] = {name: [] for name in cases}
        xids = itertools.count(1)
        try:
            for _ in range(repeats):
                for name, asked in cases.items():
                    stats = [next(xids) for _ in asked]
                    barrier = next(xids)
                    data = b"".join(port_stats_request(x, port)
                                    for x, port in zip(stats, asked, strict=True))
                    t0 = time.perf_counter()
                    channel.send(data + barrier_request(barrier))
                    answered = channel.wait([*stats, barrier])
                    times[name].append(time.perf_counter() - t0)
                    if asked != [OFPP_ANY]:  # each single-port request named its own port
                        assert all(list(answered[x]) == [port]
                                   for x, port in zip(stats, asked, strict=True)), answered
        finally:
            channel.close()
        datapath, ovs = net.datapath, net.ovs
    results = {name: summary_ms(values) for name, values in times.items()}
    for name, figures in results.items():
        progress(f"counters: {name} -> p50 {figures['p50']} ms")
    return {"benchmark": "counters", "ports": ports, "repeats": repeats, "datapath": datapath,
            "ovs": ovs, "round_trip_ms": results}


#: TCP payload per full Ethernet frame: 1448 of 1514 bytes (timestamps on).
PAYLOAD_PER_FRAME = 1448 / 1514
TCP_CASES = ("one_way", "two_way", "two_way_late")


#: From the moment both sides of an exchange listen to the first connect.
EXCHANGE_START_S = 0.05
#: How long a side may take to start listening (Python start-up on a loaded machine).
EXCHANGE_READY_TIMEOUT_S = 60.0


def start_exchange(net: Any, port: int,
                   sides: Sequence[tuple[int, int, int, bool, float]]) -> list[Any]:
    """Start one :mod:`emulator.tcp_exchange` process per side ``(rank, peer, send_bytes,
    receive, delay_s)``; once every side listens, each sends ``delay_s`` after a common start.

    The start is set only when all of them listen (a process's start-up takes seconds on a
    loaded machine), so no side connects to a peer that is not listening yet.
    """
    procs = []
    for rank, peer, send_bytes, receive, _delay in sides:
        args = [sys.executable, "-m", "emulator.tcp_exchange", net.rank_address(rank),
                net.rank_address(peer), str(port), str(send_bytes), "1" if receive else "0"]
        procs.append(net.popen(rank, args, text=True, stdin=subprocess.PIPE))
    for proc in procs:
        ready, _, _ = select.select([proc.stdout], [], [], EXCHANGE_READY_TIMEOUT_S)
        line = proc.stdout.readline() if ready else "(nothing within the timeout)"
        if line.strip() != "listening":
            proc.kill()
            raise RuntimeError(f"tcp exchange did not start: {line!r} "
                               f"{proc.communicate(timeout=10)[1].strip()}")
    start = time.time() + EXCHANGE_START_S
    for proc, (*_side, delay_s) in zip(procs, sides, strict=True):
        proc.stdin.write(f"{start + delay_s:.6f}\n")
        proc.stdin.flush()
    return procs


def _exchange(net: Any, port: int, nbytes: int, late_s: float, case: str) -> list[float]:
    """Times (s) of the measured flows of one exchange: both ways, or rank 0's alone."""
    both = case != "one_way"
    procs = start_exchange(net, port, [
        (rank, peer, nbytes if rank == 0 or both else 0, rank == 1 or both,
         late_s if (rank == 1 and case == "two_way_late") else 0.0)
        for rank, peer in ((0, 1), (1, 0))])
    times = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"tcp exchange failed: {err.strip()}")
        times += [float(line) for line in out.split()]
    if case == "two_way_late":
        return times[1:]  # the late flow: rank 1's
    return times


#: A flow slower than this many times its ideal is in the slow mode (the fast mode of a FIFO
#: two-way exchange sits at 1.0-1.1, the slow one at 1.2-1.6).
SLOW_FLOW_RATIO = 1.15
#: (shaping, TCP queue cap) of each set-up ``bench tcp`` compares; the first is the emulator's.
TCP_SETUPS = (("ack-priority", "project"), ("fifo", "project"), ("ack-priority", "kernel"))


def run_tcp_bench(link_mbps: float = 8.0, nbytes: int = 250_000, trials: int = 6,
                  late_s: float = 0.05, progress: Progress = _stderr) -> dict[str, Any]:
    """Flow time over ideal on a two-rank rail, per case and set-up (see above)."""
    ideal_s = nbytes * 8 / (link_mbps * 1e6) / PAYLOAD_PER_FRAME
    kernel_default = int(subprocess.run(
        ["sysctl", "-n", "net.ipv4.tcp_limit_output_bytes"], capture_output=True, text=True,
        check=True).stdout)
    limits = {"project": tcp_queue_limit_bytes(link_mbps), "kernel": kernel_default}
    ratios: dict[tuple[int, str], list[float]] = {}
    with contextlib.ExitStack() as stack:
        nets = []
        for shaping, queue in TCP_SETUPS:
            spec = RailSpec(servers=2, gpus_per_server=1, link_mbps=link_mbps,
                            mode="electrical", shaping=shaping)
            net = stack.enter_context(emulated_rails(spec))
            for rank in (0, 1):
                net.cmd(rank, f"sysctl -qw net.ipv4.tcp_limit_output_bytes={limits[queue]}")
            nets.append(net)
        port = 7100
        for trial in range(trials):
            for i, net in enumerate(nets):
                for case in TCP_CASES:
                    port += 1
                    ratios.setdefault((i, case), []).extend(
                        t / ideal_s for t in _exchange(net, port, nbytes, late_s, case))
            progress(f"tcp: trial {trial + 1}/{trials} done")
    results: list[dict[str, Any]] = []
    for i, (shaping, queue) in enumerate(TCP_SETUPS):
        row: dict[str, Any] = {"shaping": shaping, "tcp_queue": queue,
                               "tcp_limit_output_bytes": limits[queue]}
        for case in TCP_CASES:
            got = ratios[(i, case)]
            row[case] = {"median": round(statistics.median(got), 3),
                         "max": round(max(got), 3), "flows": len(got),
                         "slow_flows": sum(1 for r in got if r > SLOW_FLOW_RATIO)}
        progress(f"tcp: {shaping} shaping, {queue} queue cap: flow time / ideal, median "
                 + ", ".join(f"{c} {row[c]['median']} (slow {row[c]['slow_flows']}/"
                             f"{row[c]['flows']})" for c in TCP_CASES))
        results.append(row)
    return {"benchmark": "tcp", "link_mbps": link_mbps, "bytes": nbytes,
            "ideal_s": round(ideal_s, 4), "late_s": late_s, "trials": trials,
            "slow_flow_ratio": SLOW_FLOW_RATIO, "results": results}
