"""emulator.hostnet: set-up commands, routes and the router that follows circuits."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from controller.ocs import Reconfiguration
from emulator import naming
from emulator.hostnet import (
    HostRouter,
    bridge_shaping_commands,
    interface_setup_commands,
    route_commands,
    static_routes,
    tcp_queue_limit_bytes,
)
from emulator.topo import RailSpec, RankPort

P = "ot1a2"


class FakeRun:
    """Records ``run(rank, commands)`` calls instead of running them."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[str]]] = []
        self._lock = threading.Lock()

    def __call__(self, rank: int, cmds: Sequence[str]) -> None:
        with self._lock:
            self.calls.append((rank, list(cmds)))

    def by_rank(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for rank, cmds in self.calls:
            out.setdefault(rank, []).extend(cmds)
        return out


def route_to(prefix: str, rank: int, port_index: int, peer: int, peer_index: int) -> list[str]:
    """The two commands that point ``rank``'s route to ``peer`` via its port ``port_index``."""
    intf = naming.rail_intf(prefix, rank, port_index)
    dst = naming.rank_address(peer)
    return [
        f"ip neigh replace {dst} lladdr {naming.rail_mac(peer, peer_index)} dev {intf} "
        "nud permanent",
        f"ip route replace {dst}/32 dev {intf} src {naming.rank_address(rank)}",
    ]


# --- interface set-up ------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 4])
def test_setup_disables_tx_offload_on_every_interface(k: int) -> None:
    spec = RailSpec(2, 2, ports_per_rank=k)
    cmds = interface_setup_commands(spec, P, 3)
    intfs = [naming.frontend_intf(P, 3)] + [naming.rail_intf(P, 3, i) for i in range(k)]
    for intf in intfs:
        assert any(c.startswith(f"ethtool -K {intf} tx off") for c in cmds), intf
    offloaded = [c.split()[2] for c in cmds if c.startswith("ethtool -K")]
    assert sorted(offloaded) == sorted(intfs)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_setup_assigns_rank_address_to_each_rail_port(k: int) -> None:
    spec = RailSpec(2, 2, ports_per_rank=k)
    cmds = interface_setup_commands(spec, P, 3)
    addr_cmds = [c for c in cmds if c.startswith("ip addr")]
    assert addr_cmds == [f"ip addr replace 198.19.0.4/32 dev {naming.rail_intf(P, 3, i)}"
                         for i in range(k)]
    assert not any(naming.frontend_intf(P, 3) in c for c in addr_cmds)


def test_setup_disables_ipv6_and_rp_filter() -> None:
    cmds = interface_setup_commands(RailSpec(1, 2), P, 0)
    assert any("disable_ipv6=1" in c for c in cmds)
    assert any(f"net.ipv4.conf.{naming.rail_intf(P, 0, 0)}.rp_filter=0" in c for c in cmds)


@pytest.mark.parametrize(("link_mbps", "limit_bytes"), [(8.0, 4542), (50.0, 25000),
                                                        (1000.0, 500000)])
def test_setup_limits_tcp_queue_to_milliseconds_of_link_rate(link_mbps: float,
                                                             limit_bytes: int) -> None:
    assert tcp_queue_limit_bytes(link_mbps) == limit_bytes
    cmds = interface_setup_commands(RailSpec(1, 2, link_mbps=link_mbps), P, 0)
    assert f"sysctl -qw net.ipv4.tcp_limit_output_bytes={limit_bytes}" in cmds


def test_setup_keeps_tcp_queue_default_on_unshaped_links() -> None:
    cmds = interface_setup_commands(RailSpec(1, 2, link_mbps=None), P, 0)
    assert not any("tcp_limit_output_bytes" in c for c in cmds)


def _shaped(cmds: list[str]) -> list[str]:
    """Interfaces given a root qdisc by ``cmds``, in order."""
    return [c.split()[4] for c in cmds if c.startswith("tc qdisc add dev")]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_setup_shapes_each_rail_port_and_not_the_frontend(k: int) -> None:
    spec = RailSpec(2, 2, ports_per_rank=k, link_mbps=8.0)
    cmds = interface_setup_commands(spec, P, 3)
    assert _shaped(cmds) == [naming.rail_intf(P, 3, i) for i in range(k)]
    assert f"tc class add dev {naming.rail_intf(P, 3, 0)} parent 5: classid 5:1 htb " \
           "rate 8000.000kbit burst 15k" in cmds


@pytest.mark.parametrize("k", [1, 2, 4])
def test_bridge_end_of_every_rail_link_is_shaped_once(k: int) -> None:
    spec = RailSpec(3, 2, ports_per_rank=k, link_mbps=8.0, shaping="fifo")
    shaped = _shaped(bridge_shaping_commands(spec, P))
    expected = [naming.bridge_port_intf(P, p.rail, p.port)
                for r in range(spec.num_ranks) for p in spec.rank_ports(r)]
    assert sorted(shaped) == sorted(expected) and len(set(shaped)) == 3 * 2 * k


def test_unshaped_links_get_no_qdisc() -> None:
    spec = RailSpec(1, 2, link_mbps=None)
    assert not _shaped(interface_setup_commands(spec, P, 0))
    assert bridge_shaping_commands(spec, P) == []


# --- route commands --------------------------------------------------------------------------


def test_route_commands_use_local_interface_and_peer_mac() -> None:
    local = RankPort(rank=2, rail=0, port_index=1, port=6)
    peer = RankPort(rank=5, rail=0, port_index=0, port=9)
    cmds = route_commands(P, local, peer)
    assert cmds == [
        "ip neigh replace 198.19.0.6 lladdr 02:0f:00:05:00:01 dev ot1a2g2-eth2 nud permanent",
        "ip route replace 198.19.0.6/32 dev ot1a2g2-eth2 src 198.19.0.3",
    ]
    assert cmds == route_to(P, 2, 1, 5, 0)


def test_a_dilated_run_dilates_tcps_minimum_retransmission_timeout() -> None:
    """At k > 1 the links run k times slower; TCP's 200 ms floor would stay on the wall and
    fire spuriously (k = 16: 14 timeouts at 128 ranks, every one DSACKed), so the rank routes
    carry k x 200 ms; at k = 1 they keep the kernel's."""
    from testbed.emulated.runner import rail_spec
    from testbed.experiment.config import load_experiment

    local = RankPort(rank=2, rail=0, port_index=1, port=6)
    peer = RankPort(rank=5, rail=0, port_index=0, port=9)
    assert route_commands(P, local, peer, rto_min_ms=3200.0)[1].endswith(" rto_min 3200ms")
    cfg = load_experiment(Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml")
    assert rail_spec(cfg, 2, 2, 10.0).tcp_rto_min_ms is None
    assert rail_spec(cfg, 2, 2, 10.0, time_dilation=16).tcp_rto_min_ms == 3200.0
    with pytest.raises(ValueError, match="tcp_rto_min_ms"):
        RailSpec(servers=2, gpus_per_server=1, tcp_rto_min_ms=0.5)


# --- static routes ---------------------------------------------------------------------------


def peers_by_rank(routes: dict[int, list[tuple[RankPort, RankPort]]]) -> dict[int, set[int]]:
    """rank -> the set of peer ranks it has a route to."""
    return {r: {peer.rank for _, peer in pairs} for r, pairs in routes.items()}


@pytest.mark.parametrize(("mode", "k"), [("electrical", 1), ("electrical", 2), ("electrical", 4),
                                         ("ocs", 1)])
def test_static_routes_reach_every_other_rank_on_the_rail(mode: str, k: int) -> None:
    spec = RailSpec(3, 4, rails=2, ports_per_rank=k, mode=mode)
    routes = static_routes(spec)
    assert set(routes) == set(range(spec.num_ranks))
    for rank, peers in peers_by_rank(routes).items():
        expected = set(spec.ranks_on_rail(spec.rail_of(rank))) - {rank}
        assert peers == expected
        assert len(routes[rank]) == len(expected), "one route per peer"
    for rank, pairs in routes.items():
        for local, peer in pairs:
            assert local.rank == rank and local in spec.rank_ports(rank)
            assert peer in spec.rank_ports(peer.rank)
            assert local.rail == peer.rail


@pytest.mark.parametrize("k", [2, 4])
def test_electrical_routes_are_symmetric_in_port_index(k: int) -> None:
    spec = RailSpec(4, 1, ports_per_rank=k, mode="electrical")
    routes = static_routes(spec)
    table = {(loc.rank, peer.rank): (loc.port_index, peer.port_index)
             for pairs in routes.values() for loc, peer in pairs}
    for (x, y), (kx, ky) in table.items():
        assert kx == ky
        assert table[(y, x)] == (ky, kx)


@pytest.mark.parametrize("k", [2, 4])
def test_static_routes_ocs_with_several_ports_are_empty(k: int) -> None:
    spec = RailSpec(3, 2, ports_per_rank=k)
    routes = static_routes(spec)
    assert routes == {r: [] for r in range(spec.num_ranks)}


def test_install_static_runs_routes_once_per_rank() -> None:
    spec = RailSpec(3, 1)
    run = FakeRun()
    router = HostRouter(spec, P, run)
    router.install_static()
    got = run.by_rank()
    assert got[0] == route_to(P, 0, 0, 1, 0) + route_to(P, 0, 0, 2, 0)
    assert set(got) == {0, 1, 2}
    n = len(run.calls)
    router.install_static()
    assert len(run.calls) == n, "re-installing identical routes must send nothing"


# --- router following circuits ---------------------------------------------------------------


def test_on_circuits_k2_repoints_both_sides() -> None:
    spec = RailSpec(2, 1, ports_per_rank=2)  # rank 0: ports 1, 2; rank 1: ports 3, 4
    run = FakeRun()
    router = HostRouter(spec, P, run)
    x_port = spec.rank_ports(0)[1].port
    y_port = spec.rank_ports(1)[0].port
    router.on_circuits([Reconfiguration.of(0, add=[(x_port, y_port)])])
    got = run.by_rank()
    assert got == {
        0: route_to(P, 0, 1, 1, 0),  # rank 0 reaches rank 1 via its port 1, MAC of 1's port 0
        1: route_to(P, 1, 0, 0, 1),
    }
    assert "dev ot1a2g0-eth2" in got[0][0] and "02:0f:00:01:00:01" in got[0][0]
    assert "dev ot1a2g1-eth1" in got[1][0] and "02:0f:00:00:01:01" in got[1][0]


def test_on_circuits_same_circuit_twice_is_idempotent() -> None:
    spec = RailSpec(2, 1, ports_per_rank=2)
    run = FakeRun()
    router = HostRouter(spec, P, run)
    reconf = Reconfiguration.of(0, add=[(2, 3)])
    router.on_circuits([reconf])
    n = len(run.calls)
    assert n == 2
    router.on_circuits([reconf])
    assert len(run.calls) == n


def test_on_circuits_new_port_pair_repoints_again() -> None:
    spec = RailSpec(2, 1, ports_per_rank=2)
    run = FakeRun()
    router = HostRouter(spec, P, run)
    router.on_circuits([Reconfiguration.of(0, add=[(2, 3)])])
    run.calls.clear()
    router.on_circuits([Reconfiguration.of(0, add=[(1, 4)], remove=[(2, 3)])])
    assert run.by_rank() == {0: route_to(P, 0, 0, 1, 1), 1: route_to(P, 1, 1, 0, 0)}


def test_on_circuits_several_rails_in_one_batch() -> None:
    spec = RailSpec(2, 2, ports_per_rank=2)  # rail r holds ranks r and r+2
    run = FakeRun()
    router = HostRouter(spec, P, run)
    router.on_circuits([Reconfiguration.of(0, add=[(1, 3)]), Reconfiguration.of(1, add=[(2, 4)])])
    assert run.by_rank() == {
        0: route_to(P, 0, 0, 2, 0), 2: route_to(P, 2, 0, 0, 0),
        1: route_to(P, 1, 1, 3, 1), 3: route_to(P, 3, 1, 1, 1),
    }


def test_on_circuits_removal_only_sends_nothing() -> None:
    spec = RailSpec(2, 1, ports_per_rank=2)
    run = FakeRun()
    HostRouter(spec, P, run).on_circuits([Reconfiguration.of(0, remove=[(2, 3)])])
    assert run.calls == []


def test_on_circuits_with_one_port_sends_nothing() -> None:
    spec = RailSpec(3, 1, ports_per_rank=1)
    run = FakeRun()
    HostRouter(spec, P, run).on_circuits([Reconfiguration.of(0, add=[(1, 2)])])
    assert run.calls == []


# --- spares taking a rank over ----------------------------------------------------------------


def test_a_spare_gets_no_address_until_it_takes_a_rank_over() -> None:
    spec = RailSpec(2, 1, spare_servers=1)
    cmds = interface_setup_commands(spec, P, 2)  # host 2 = spare 0
    assert not any(c.startswith("ip addr") for c in cmds)
    assert any(c.startswith("ethtool -K ot1a2x0-eth1 tx off") for c in cmds)


def test_assign_gives_the_spare_the_ranks_identity_and_routes() -> None:
    spec = RailSpec(3, 1, spare_servers=1)  # ranks 0-2 on ports 1-3; spare host 3 on port 4
    run = FakeRun()
    router = HostRouter(spec, P, run)
    router.install_static()
    run.calls.clear()
    router.release(1)
    router.assign(1, 3)
    got = run.by_rank()
    assert set(got) == {3}, "only the spare is touched: peers keep routes and neighbours"
    cmds = got[3]
    identity = cmds[0]  # one `ip -batch` for the whole identity
    assert identity.endswith("| ip -batch -")
    assert "'link set dev ot1a2x0-eth1 address 02:0f:00:01:00:01'" in identity
    assert "'addr replace 198.19.0.2/32 dev ot1a2x0-eth1'" in identity
    assert identity.index("'addr flush dev ot1a2x0-eth1'") < identity.index(
        "'addr replace 198.19.0.2/32")
    for peer in (0, 2):  # rank 1's routes, from the spare's interface
        assert (f"ip route replace {naming.rank_address(peer)}/32 dev ot1a2x0-eth1 src "
                "198.19.0.2") in cmds
    assert router.host_of(1) == 3


def test_circuits_to_a_spare_route_as_the_rank_it_carries() -> None:
    spec = RailSpec(2, 1, ports_per_rank=2, spare_servers=1)  # spare host 2: ports 5, 6
    run = FakeRun()
    router = HostRouter(spec, P, run)
    router.on_circuits([Reconfiguration.of(0, add=[(1, 5)])])
    assert run.calls == [], "a dark spare carries nobody: no route"
    router.release(1)
    router.assign(1, 2)
    run.calls.clear()
    router.on_circuits([Reconfiguration.of(0, add=[(1, 6)])])  # rank 0 port 0 <-> spare port 1
    got = run.by_rank()
    assert got[0] == route_to(P, 0, 0, 1, 1)  # to rank 1's MAC of port 1: the spare has it
    assert got[2] == [
        f"ip neigh replace 198.19.0.1 lladdr {naming.rail_mac(0, 0)} dev ot1a2x0-eth2 "
        "nud permanent",
        "ip route replace 198.19.0.1/32 dev ot1a2x0-eth2 src 198.19.0.2"]
    router.on_circuits([Reconfiguration.of(0, add=[(3, 5)])])  # the failed host's port 3
    assert 1 not in run.by_rank(), "the failed host carries nobody any more"


def test_on_circuits_ignores_shadow_rails() -> None:
    """A rail-state shadow rail has no host behind its ports: its flips route nothing."""
    spec = RailSpec(2, 1, ports_per_rank=2, shadow_rails=2)  # (an OCS data rail, to route)
    run = FakeRun()
    HostRouter(spec, P, run).on_circuits([Reconfiguration.of(1, add=[(1, 2)]),
                                          Reconfiguration.of(0, add=[(2, 3)])])
    assert sorted(run.by_rank()) == [0, 1]
    assert len(run.calls) == 2
