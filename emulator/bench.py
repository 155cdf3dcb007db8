"""Benchmarks of the emulated OCS (JSON on stdout via ``opus-testbed bench``).

* ``fidelity``: the dark period as the data plane sees it. Rank 0 streams probe frames over one
  port while its circuit alternates between rank 1 and rank 2; the dark period of each switch is
  the time from the last frame at the old peer to the first frame at the new one (kernel receive
  timestamps). Reported per injected delay with its error (measured - injected), beside the
  error of the OCS app's own timestamps (``t_light - t_dark - delay``, what every emulated run
  checks: ``testbed.metrics.darktime``).
* ``control``: what a reconfiguration costs beyond its injected delay, measured inside the OCS
  app from request receipt to the confirming barrier: ``(t_light - t_request) - delay``.
* ``tcp``: how close TCP between two ranks comes to the shaped link rate: one way, both ways
  at once (a two-rank ring step) and both ways with the second flow starting late (into a busy
  reverse direction). Each figure is a flow's time over the ideal (its bytes in full frames at
  the link rate), with the project's TCP queue cap (:func:`emulator.hostnet.
  tcp_queue_limit_bytes`) and, for comparison in the same run, with the kernel's default.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from controller.ocs import Circuit, Reconfiguration
from emulator.dataplane import Recorders, start_stream
from emulator.hostnet import tcp_queue_limit_bytes
from emulator.network import emulated_rails
from emulator.probe import dark_gaps_s, probe_arrivals
from emulator.topo import RailSpec

Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty sequence."""
    data = sorted(values)
    if not data:
        raise ValueError("percentile of no values")
    pos = (len(data) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summary_ms(values_s: Sequence[float]) -> dict[str, float]:
    ms = [v * 1e3 for v in values_s]
    return {"p50": round(percentile(ms, 50), 3), "p99": round(percentile(ms, 99), 3),
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


#: TCP payload per full Ethernet frame: 1448 of 1514 bytes (timestamps on).
PAYLOAD_PER_FRAME = 1448 / 1514
TCP_CASES = ("one_way", "two_way", "two_way_late")


def _exchange(net: Any, port: int, nbytes: int, late_s: float, case: str) -> list[float]:
    """Times (s) of the measured flows of one exchange: both ways, or rank 0's alone."""
    both = case != "one_way"
    start = time.time() + 0.5  # both processes up and listening well before
    procs = []
    for rank, peer in ((0, 1), (1, 0)):
        sends = nbytes if rank == 0 or both else 0
        delay = late_s if (rank == 1 and case == "two_way_late") else 0.0
        args = [sys.executable, "-m", "emulator.tcp_exchange", net.rank_address(rank),
                net.rank_address(peer), str(port), str(sends),
                "1" if (rank == 1 or both) else "0", f"{start + delay:.6f}"]
        procs.append(net.popen(rank, args, text=True))
    times = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"tcp exchange failed: {err.strip()}")
        times += [float(line) for line in out.split()]
    if case == "two_way_late":
        return times[1:]  # the late flow: rank 1's
    return times


def run_tcp_bench(link_mbps: float = 8.0, nbytes: int = 250_000, trials: int = 6,
                  late_s: float = 0.05, progress: Progress = _stderr) -> dict[str, Any]:
    """Flow time over ideal on a two-rank rail, per case and TCP queue cap (see above)."""
    ideal_s = nbytes * 8 / (link_mbps * 1e6) / PAYLOAD_PER_FRAME
    kernel_default = int(subprocess.run(
        ["sysctl", "-n", "net.ipv4.tcp_limit_output_bytes"], capture_output=True, text=True,
        check=True).stdout)
    results: list[dict[str, Any]] = []
    spec = RailSpec(servers=2, gpus_per_server=1, link_mbps=link_mbps, mode="electrical")
    for queue, limit in (("project", tcp_queue_limit_bytes(link_mbps)),
                         ("kernel", kernel_default)):
        with emulated_rails(spec) as net:
            for rank in (0, 1):
                net.cmd(rank, f"sysctl -qw net.ipv4.tcp_limit_output_bytes={limit}")
            port = 7100
            row: dict[str, Any] = {"tcp_queue": queue, "tcp_limit_output_bytes": limit}
            for case in TCP_CASES:
                ratios = []
                for _ in range(trials):
                    port += 1
                    ratios += [t / ideal_s for t in _exchange(net, port, nbytes, late_s, case)]
                row[case] = {"median": round(statistics.median(ratios), 3),
                             "max": round(max(ratios), 3), "flows": len(ratios)}
                progress(f"tcp: {queue} queue cap, {case}: flow time / ideal, median "
                         f"{row[case]['median']}")
            results.append(row)
    return {"benchmark": "tcp", "link_mbps": link_mbps, "bytes": nbytes,
            "ideal_s": round(ideal_s, 4), "late_s": late_s, "trials": trials,
            "results": results}
