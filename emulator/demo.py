"""``opus-testbed demo``: the emulated OCS at work, step by step, with a readable printout.

Three servers with two GPUs each (two rails, three ranks per rail), Piezo switching (25 ms):
light a circuit, send pings and a TCP transfer across it, show that a rank without a circuit is
unreachable, reject a conflicting request (the flows stay as they were), reconfigure with
break-before-make and time the dark period, then tear everything down and show nothing is left.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from controller.ocs import Circuit, Reconfiguration, ReconfigurationRejected
from emulator.dataplane import ping_ok, tcp_transfer_mbps
from emulator.network import emulated_rails
from emulator.runstate import leftovers
from emulator.topo import RailSpec

Printer = Callable[[str], None]


def _print(msg: str) -> None:
    print(msg, flush=True)


def run_demo(out: Printer = _print) -> int:
    spec = RailSpec(servers=3, gpus_per_server=2, ports_per_rank=1, link_mbps=100,
                    switching_delay="piezo")
    out("== opus-testbed demo: an emulated photonic rail ==")
    out(f"cluster: {spec.servers} servers x {spec.gpus_per_server} GPUs, {spec.num_rails} rails, "
        f"{spec.ports_per_rank} port per rank per rail, {spec.link_mbps:g} Mbit/s per port, "
        f"switching delay piezo = {spec.delay_ms(0):g} ms")
    t0 = time.monotonic()
    with emulated_rails(spec) as net:
        prefix = net.prefix
        datapath = "userspace" if net.datapath == "user" else "kernel"
        out(f"[1] network up in {time.monotonic() - t0:.1f} s: run prefix {prefix}, "
            f"{datapath} OVS datapath")
        for rail in range(spec.num_rails):
            ranks = spec.ranks_on_rail(rail)
            ports = ", ".join(f"rank {r} -> port {net.port(r)}" for r in ranks)
            out(f"    rail {rail} (OCS bridge {prefix}r{rail}): {ports}")
        a, b, c = spec.ranks_on_rail(0)
        pa, pb, pc = net.port(a), net.port(b), net.port(c)

        res = net.driver.apply(0, add=[(pa, pb)])
        out(f"[2] light rail0 {pa}<->{pb} (rank {a} <-> rank {b}): dark->light "
            f"{res.dark_ms:.1f} ms")
        out(f"    ping rank {a} -> rank {b}: {'ok' if ping_ok(net, a, b, 3) else 'FAILED'}")
        out(f"    ping rank {a} -> rank {c} (no circuit): "
            f"{'unreachable, as on glass' if not ping_ok(net, a, c) else 'REACHED (wrong!)'}")
        mbps = tcp_transfer_mbps(net, a, b)
        out(f"    TCP transfer rank {a} -> rank {b} (iperf3, 1 s): {mbps:.1f} Mbit/s "
            f"on a {spec.link_mbps:g} Mbit/s port")

        flows_before = net.dump_flows(0)
        try:
            net.driver.apply(0, add=[(pa, pc)])
            out("[3] conflicting request ACCEPTED (wrong!)")
        except ReconfigurationRejected as exc:
            same = net.dump_flows(0) == flows_before
            out(f"[3] conflicting request rejected: {exc}")
            out(f"    flows on the bridge unchanged: {'yes' if same else 'NO'}")

        res = net.driver.apply_many([Reconfiguration.of(0, add=[(pa, pc)],
                                                        remove=[Circuit(0, pa, pb)])])[0]
        out(f"[4] reconfigure rail0: {pa}<->{pb}  =>  {pa}<->{pc}, break-before-make: dark "
            f"{res.dark_ms:.1f} ms (injected {spec.delay_ms(0):g} ms), acknowledged "
            f"{(res.t_light_s - res.t_request_s) * 1e3:.1f} ms after the request")
        out(f"    ping rank {a} -> rank {c}: {'ok' if ping_ok(net, a, c, 3) else 'FAILED'}; "
            f"rank {a} -> rank {b}: {'unreachable' if not ping_ok(net, a, b) else 'REACHED'}")
        out("    flows on rail 0 now:")
        for line in net.dump_flows(0):
            out(f"      {line}")
    left = leftovers(prefix)
    clean = not any(left.values())
    out(f"[5] torn down; leftovers of run {prefix}: "
        f"{'none' if clean else json.dumps(left)}")
    return 0 if clean else 1


def main() -> int:
    return run_demo()


if __name__ == "__main__":
    sys.exit(main())

