"""Alternate two pairs of circuits on one emulated rail many times under the wire check's
capture and probes, and count frames at a non-peer (docs/wire.md, "Frames at a non-peer").

    sudo .venv/bin/python scripts/wire_stress.py OUT_DIR [SWITCHES]

Four ranks on one rail (25 Mbit/s links, 10 ms switching); circuits {0,1},{2,3} and {0,2},{1,3}
take turns every switch with 5 ms of light between. Prints the frames captured, the crossings
and the crossings no commanded configuration allowed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from controller.ocs import Circuit, Reconfiguration
from emulator.network import emulated_rails
from emulator.topo import RailSpec
from emulator.wirecap import wire_capture
from testbed.metrics.wire import Commanded, forwarding, non_peer, read_frames, read_port_map


def _pairs(circuits: list[tuple[int, int]]) -> frozenset[frozenset[int]]:
    return frozenset(frozenset(c) for c in circuits)


def main(out: Path, switches: int) -> None:
    spec = RailSpec(servers=4, gpus_per_server=1, link_mbps=25, switching_delay=10)
    commanded: list[Commanded] = []
    with emulated_rails(spec, run_dir=out / "emulator") as net:
        p = [net.port(r) for r in range(4)]
        first = [(p[0], p[1]), (p[2], p[3])]
        second = [(p[0], p[2]), (p[1], p[3])]
        with wire_capture(net, out / "wire"):
            t = time.time()
            net.driver.apply(0, add=first)
            commanded.append(Commanded(0, t, time.time(), frozenset(), _pairs(first)))
            lit, nxt = first, second
            for _ in range(switches):
                time.sleep(0.005)
                t = time.time()
                net.driver.apply_many([Reconfiguration.of(
                    0, add=nxt, remove=[Circuit(0, a, b) for a, b in lit])])
                commanded.append(Commanded(0, t, time.time(), _pairs(lit), _pairs(nxt)))
                lit, nxt = nxt, lit
            t_end = time.time()
    meta = json.loads((out / "wire" / "wire.json").read_text())
    frames = [f for f in read_frames(out / "wire", read_port_map(meta))
              if commanded[0].t_request_s <= f.t_s <= t_end]
    crossings, _dropped, _ = forwarding(frames)
    bad = non_peer(crossings, commanded)
    print(json.dumps({"switches": switches, "frames": len(frames), "crossings": len(crossings),
                      "non_peer": len(bad), "kernel_drops": meta["kernel_drops"]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 150)
