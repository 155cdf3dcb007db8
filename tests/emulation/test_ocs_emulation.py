"""The emulated OCS on real OVS and Mininet: circuits, isolation, rules, timing, teardown."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path

import pytest
from dark_bounds import dark_bound_ms

from controller.ocs import (
    ApplyResult,
    Circuit,
    PortState,
    Reconfiguration,
    ReconfigurationRejected,
)
from emulator.dataplane import Recorders, ping_ok, start_stream, tcp_transfer_mbps
from emulator.network import EmulatedRails, emulated_rails, wait_for
from emulator.probe import dark_gaps_s, missing_seqs, probe_arrivals
from emulator.topo import RailSpec


def rx_packets(net: EmulatedRails, rank: int) -> int:
    """Frames received on ``rank``'s rail interface (its counter, read in its namespace)."""
    out = net.cmd(rank, f"ip -s -j link show dev {net.rail_intf(rank)}")
    return int(json.loads(out[out.index("["):])[0]["stats64"]["rx"]["packets"])


def test_ping_and_tcp_across_a_lit_circuit(no_leftovers: list[str]) -> None:
    spec = RailSpec(servers=3, gpus_per_server=1, link_mbps=100)
    with emulated_rails(spec) as net:
        no_leftovers.append(net.prefix)
        assert not ping_ok(net, 0, 1), "reached a peer before any circuit was lit"
        net.driver.apply(0, add=[(net.port(0), net.port(1))])
        assert ping_ok(net, 0, 1, count=3)
        mbps = tcp_transfer_mbps(net, 0, 1, seconds=1)
        # TCP must flow, not stall (with TX checksum offload on, it stalls near 0); the rate
        # itself is a benchmark figure: a busy 2-core machine measured 24 Mbit/s here once
        assert 10 < mbps <= 105, f"TCP goodput {mbps:.1f} Mbit/s on a 100 Mbit/s circuit"


def test_traffic_stays_on_its_circuit(tmp_path: Path, no_leftovers: list[str]) -> None:
    spec = RailSpec(servers=4, gpus_per_server=1, link_mbps=100)
    with emulated_rails(spec) as net:
        no_leftovers.append(net.prefix)
        net.driver.apply(0, add=[(net.port(0), net.port(1)), (net.port(2), net.port(3))])
        watched = {r: [net.rail_intf(r), f"{net.prefix}g{r}-eth0"] for r in range(4)}
        with Recorders(net, watched, tmp_path) as rec:
            tcp_transfer_mbps(net, 0, 1, seconds=1)
            frames = rec.stop()
        ours = {net.rank_address(0), net.rank_address(1)}

        def flow_frames(rank: int, intf: str) -> int:
            return sum(1 for f in frames[(rank, intf)] if {f.ip_src, f.ip_dst} <= ours)

        assert flow_frames(1, net.rail_intf(1)) > 100, "recorder missed the transfer itself"
        for (rank, intf) in frames:
            if rank in (2, 3) or intf.endswith("-eth0"):
                assert flow_frames(rank, intf) == 0, f"transfer frames leaked to {intf}"
        assert not ping_ok(net, 0, 2), "rank 0 reached rank 2 without a circuit"
        assert not ping_ok(net, 3, 1), "rank 3 reached rank 1 without a circuit"


def test_conflicting_requests_change_nothing(no_leftovers: list[str]) -> None:
    spec = RailSpec(servers=3, gpus_per_server=2, link_mbps=None)
    with emulated_rails(spec) as net:
        no_leftovers.append(net.prefix)
        p = {r: net.port(r) for r in range(6)}  # rail 0: ranks 0, 2, 4; rail 1: 1, 3, 5
        net.driver.apply(0, add=[(p[0], p[2])])
        flows = {rail: net.dump_flows(rail) for rail in (0, 1)}
        circuits = net.driver.circuits(0)
        bad = [
            ([Reconfiguration.of(0, add=[(p[0], p[4])])], {p[0]}),  # port 1 has a peer
            ([Reconfiguration.of(0, add=[(p[4], 99)])], {99}),  # no such port
            ([Reconfiguration.of(0, remove=[(p[2], p[4])])], {p[2], p[4]}),  # not there
            # one valid rail and one invalid: all-or-nothing
            ([Reconfiguration.of(1, add=[(p[1], p[3])]),
              Reconfiguration.of(0, add=[(p[2], p[4])])], {p[2]}),
        ]
        for reconfs, named in bad:
            with pytest.raises(ReconfigurationRejected) as err:
                net.driver.apply_many(reconfs)
            assert err.value.rail == 0 and named <= set(err.value.ports), str(err.value)
            assert "rail 0" in str(err.value)
            assert {rail: net.dump_flows(rail) for rail in (0, 1)} == flows
            assert net.driver.circuits(0) == circuits
            assert net.driver.circuits(1) == frozenset()


def test_untouched_circuit_keeps_light_while_others_switch(
        tmp_path: Path, no_leftovers: list[str]) -> None:
    spec = RailSpec(servers=5, gpus_per_server=1, link_mbps=None, switching_delay=100)
    with emulated_rails(spec) as net:
        no_leftovers.append(net.prefix)
        p = {r: net.port(r) for r in range(5)}
        net.driver.apply(0, add=[(p[0], p[1]), (p[2], p[3])])
        with Recorders(net, {1: [net.rail_intf(1)]}, tmp_path) as rec:
            sender = start_stream(net, 0, net.rail_intf(0), duration_s=3600, interval_us=200)
            wait_for(lambda: net.driver.port_states(0)[p[1]] == PortState.LIT, 5, "lit")
            seen_dark: list[dict[int, PortState]] = []
            results: list[ApplyResult] = []
            peer = p[3]
            for _ in range(3):
                new = p[4] if peer == p[3] else p[3]
                reconf = Reconfiguration.of(0, add=[(p[2], new)], remove=[Circuit(0, p[2], peer)])
                worker = threading.Thread(
                    target=lambda r=reconf: results.extend(net.driver.apply_many([r])),
                    daemon=True)
                worker.start()
                seen_dark.append(wait_for(
                    lambda: (s := net.driver.port_states(0))[p[2]] == PortState.DARK and s,
                    5, "the switched ports to go dark"))
                worker.join(timeout=10)
                assert not worker.is_alive(), "a 100 ms switch still running after 10 s"
                peer = new
            sender.terminate()
            sender.wait(timeout=5)
            frames = rec.stop()
        assert len(results) == 3, "a switch failed (its thread's error is above)"
        assert all(100.0 <= r.dark_ms <= dark_bound_ms(100.0) for r in results), [
            r.dark_ms for r in results]
        for states in seen_dark:
            assert states[p[0]] == states[p[1]] == PortState.LIT
        arrivals = probe_arrivals(frames[(1, net.rail_intf(1))], stream=1)
        assert len(arrivals) > 500, "too few probe frames to judge continuity"
        assert missing_seqs(arrivals) == [], "the untouched circuit lost frames"
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
        assert max(gaps) < 0.05, f"untouched circuit went quiet for {max(gaps) * 1e3:.1f} ms"


def test_reconfiguration_is_break_before_make_with_the_injected_delay(
        tmp_path: Path, no_leftovers: list[str]) -> None:
    spec = RailSpec(servers=3, gpus_per_server=1, link_mbps=None, switching_delay="3d-mems")
    delay_ms = 15.0  # Table 3's 3D-MEMS
    with emulated_rails(spec) as net:
        no_leftovers.append(net.prefix)
        p0, p1, p2 = net.port(0), net.port(1), net.port(2)
        assert net.driver.describe()[0].switching_delay_ms == delay_ms
        net.driver.apply(0, add=[(p0, p1)])
        # rank 0 streams probe frames over its port while the circuit moves from rank 1 to 2
        watched = {1: [net.rail_intf(1)], 2: [net.rail_intf(2)]}
        with Recorders(net, watched, tmp_path) as rec:
            sender = start_stream(net, 0, net.rail_intf(0), duration_s=3600, interval_us=200)
            old = rx_packets(net, 1)
            wait_for(lambda: rx_packets(net, 1) > old + 50, 5, "probe frames on the old circuit")
            res = net.driver.apply_many(
                [Reconfiguration.of(0, add=[(p0, p2)], remove=[Circuit(0, p0, p1)])])[0]
            new = rx_packets(net, 2)
            wait_for(lambda: rx_packets(net, 2) > new + 50, 5, "probe frames on the new circuit")
            sender.terminate()
            sender.wait(timeout=5)
            frames = rec.stop()
        assert res.t_request_s <= res.t_dark_s < res.t_light_s
        assert delay_ms <= res.dark_ms <= dark_bound_ms(delay_ms), (
            f"the OCS app reports {res.dark_ms:.2f} ms dark for a {delay_ms} ms switch")
        # the wire, apart from the app: every frame reached rank 1 before any reached rank 2
        # (break before make), rank 2's first frame came at least the delay after the app
        # began the break, and the stream was dark no longer than the bound
        arrivals = [probe_arrivals(frames[(r, net.rail_intf(r))], stream=1) for r in (1, 2)]
        (gap_s,) = dark_gaps_s(arrivals)
        first_new_s = arrivals[1][0][0]
        assert first_new_s - res.t_dark_s >= delay_ms / 1e3, (
            f"rank 2 got a frame {(first_new_s - res.t_dark_s) * 1e3:.2f} ms into the switch")
        assert 0 < gap_s * 1e3 <= dark_bound_ms(delay_ms), f"wire dark {gap_s * 1e3:.2f} ms"
        assert ping_ok(net, 0, 2) and not ping_ok(net, 0, 1)
        # the switch went over the rail's own OpenFlow connection, not os-ken's (slower) one
        log = [json.loads(line) for line in
               (net.run_dir / "ocs-events.jsonl").read_text().splitlines()]
        channels = [e for e in log if e.get("event") == "channel"]
        assert [(e["rail"], "path" in e) for e in channels] == [(0, True)], channels


def test_two_ports_per_rank_route_each_peer_over_its_own_circuit(
        no_leftovers: list[str]) -> None:
    spec = RailSpec(servers=3, gpus_per_server=1, ports_per_rank=2, link_mbps=None)
    with emulated_rails(spec) as net:
        no_leftovers.append(net.prefix)
        # rank 0 port 1 <-> rank 1 port 0, and rank 0 port 0 <-> rank 2 port 1: both at once
        net.driver.apply(0, add=[(net.port(0, 1), net.port(1, 0)),
                                 (net.port(0, 0), net.port(2, 1))])
        assert ping_ok(net, 0, 1) and ping_ok(net, 0, 2) and ping_ok(net, 2, 0)
        assert not ping_ok(net, 1, 2)
        route = net.cmd(0, f"ip route get {net.rank_address(1)}")
        assert net.rail_intf(0, 1) in route, route


def test_electrical_baseline_reaches_every_pair_on_a_rail(no_leftovers: list[str]) -> None:
    spec = RailSpec(servers=3, gpus_per_server=2, link_mbps=None, mode="electrical")
    with emulated_rails(spec) as net:
        no_leftovers.append(net.prefix)
        for rail in range(spec.num_rails):
            ranks = spec.ranks_on_rail(rail)
            for a in ranks:
                for b in ranks:
                    if a != b:
                        assert ping_ok(net, a, b), f"baseline: rank {a} cannot reach {b}"
        with pytest.raises(ReconfigurationRejected, match="electrical"):
            net.driver.apply(0, add=[(net.port(0), net.port(2))])


def test_exception_mid_run_leaves_nothing(no_leftovers: list[str]) -> None:
    spec = RailSpec(servers=2, gpus_per_server=2, link_mbps=100)
    with pytest.raises(RuntimeError, match="boom"), emulated_rails(spec) as net:
        no_leftovers.append(net.prefix)
        net.driver.apply(0, add=[(net.port(0), net.port(2))])
        start_stream(net, 0, net.rail_intf(0), duration_s=3600)
        raise RuntimeError("boom")
