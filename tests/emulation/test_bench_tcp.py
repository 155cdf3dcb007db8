"""``opus-testbed bench tcp`` runs its exchanges end to end, and the emulator's links send ACKs
ahead of data on both ends (root). Figures are the bench's."""

from __future__ import annotations

import os
import re
import subprocess

from emulator import naming
from emulator.bench import TCP_CASES, TCP_SETUPS, run_tcp_bench, start_exchange
from emulator.hostnet import tcp_queue_limit_bytes
from emulator.network import emulated_rails
from emulator.runstate import load_records
from emulator.shaping import ACK_CLASS, DATA_CLASS
from emulator.topo import RailSpec


def _our_runs() -> set[str]:
    """Prefixes of the networks this process recorded (other helpers' runs come and go)."""
    return {r.prefix for r in load_records() if r.owner_pid == os.getpid()}


def test_tcp_bench_measures_every_case_in_every_setup() -> None:
    before = _our_runs()
    result = run_tcp_bench(link_mbps=8.0, nbytes=100_000, trials=1, late_s=0.02,
                           progress=lambda _m: None)
    assert [(r["shaping"], r["tcp_queue"]) for r in result["results"]] == list(TCP_SETUPS)
    project, fifo, kernel = result["results"]
    assert project["tcp_limit_output_bytes"] == fifo["tcp_limit_output_bytes"] \
        == tcp_queue_limit_bytes(8.0)
    assert kernel["tcp_limit_output_bytes"] != project["tcp_limit_output_bytes"]
    for row in result["results"]:
        assert [row[c]["flows"] for c in TCP_CASES] == [1, 2, 1]
        for case in TCP_CASES:  # every flow delivered its bytes: no time is far below ideal
            assert row[case]["median"] > 0.8, (row["shaping"], row["tcp_queue"], case, row[case])
            assert 0 <= row[case]["slow_flows"] <= row[case]["flows"]
    assert _our_runs() <= before  # every network torn down


def _sent(tc_output: str, classid: str) -> tuple[int, int]:
    """(bytes, packets) an HTB class sent, from ``tc -s class show``."""
    match = re.search(rf"class htb {classid} .*?\n Sent (\d+) bytes (\d+) pkt", tc_output)
    assert match, (classid, tc_output)
    return int(match.group(1)), int(match.group(2))


def test_acks_and_data_take_their_own_class_on_both_ends_of_a_link() -> None:
    spec = RailSpec(servers=2, gpus_per_server=1, link_mbps=8.0, mode="electrical")
    with emulated_rails(spec) as net:
        sender, receiver = start_exchange(net, 7001, [(0, 1, 60000, False, 0.0),
                                                      (1, 0, 0, True, 0.0)])
        out, err = sender.communicate(timeout=60)
        assert sender.returncode == 0 and float(out), err
        receiver.communicate(timeout=60)
        # rank 0 sent data and the bridge passed it on; rank 1 sent ACKs and the bridge too
        ends = {"rank 0": net.cmd(0, f"tc -s class show dev {net.rail_intf(0)}"),
                "rank 1": net.cmd(1, f"tc -s class show dev {net.rail_intf(1)}")}
        for rank in (0, 1):
            intf = naming.bridge_port_intf(net.prefix, 0, net.port(rank))
            ends[f"bridge to rank {rank}"] = subprocess.run(
                ["tc", "-s", "class", "show", "dev", intf], capture_output=True, text=True,
                check=True).stdout
    data_frames = 60000 // 1448
    for end in ("rank 0", "bridge to rank 1"):
        assert _sent(ends[end], DATA_CLASS)[1] >= data_frames, (end, ends[end])
    for end in ("rank 1", "bridge to rank 0"):
        assert _sent(ends[end], ACK_CLASS)[1] >= data_frames // 4, (end, ends[end])
        # not one data segment went back (the bridge's own IPv6 chatter may: small frames)
        assert _sent(ends[end], DATA_CLASS)[0] < 1448, (end, ends[end])
