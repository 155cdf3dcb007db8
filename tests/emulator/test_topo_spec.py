"""emulator.topo.RailSpec: validation, rank placement, ports and the rail description."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator import naming
from emulator.topo import RailSpec, RankPort


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"servers": 0}, "servers"),
        ({"gpus_per_server": 0}, "gpus_per_server"),
        ({"rails": 0}, "rails"),
        ({"rails": 5}, "rails"),
        ({"ports_per_rank": 3}, "ports_per_rank"),
        ({"ports_per_rank": 0}, "ports_per_rank"),
        ({"ports_per_rank": 8}, "ports_per_rank"),
        ({"link_mbps": 1001.0}, "link_mbps"),
        ({"link_mbps": 0.0}, "link_mbps"),
        ({"link_mbps": -5.0}, "link_mbps"),
        ({"mode": "packet"}, "mode"),
        ({"switching_delay": "warp-drive"}, "switching_delay"),
        ({"switching_delay": -1.0}, "switching_delay"),
        ({"per_rail_delay": {1: "warp-drive"}}, "per_rail_delay[1]"),
        ({"per_rail_delay": {4: 10.0}}, "per_rail_delay"),
        ({"per_rail_delay": {-1: 10.0}}, "per_rail_delay"),
        ({"servers": 63}, "ranks"),
    ],
)
def test_invalid_spec_error_names_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"servers": 2, "gpus_per_server": 4, **kwargs}
    with pytest.raises(ValueError) as info:
        RailSpec(**args)  # type: ignore[arg-type]
    assert field in str(info.value)


def test_unknown_technology_error_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="3d-mems"):
        RailSpec(2, 2, switching_delay="warp-drive")


def test_several_problems_are_reported_together() -> None:
    with pytest.raises(ValueError) as info:
        RailSpec(0, 2, ports_per_rank=3, mode="x")
    msg = str(info.value)
    assert "servers" in msg and "ports_per_rank" in msg and "mode" in msg


def test_limits_are_inclusive() -> None:
    RailSpec(249, 1, ports_per_rank=4, link_mbps=1000.0)
    RailSpec(83, 3, link_mbps=None)
    RailSpec(1, 8, rails=8)
    with pytest.raises(ValueError, match="249"):
        RailSpec(250, 1)


@pytest.mark.parametrize(("servers", "gpus", "rails"), [(3, 4, None), (2, 4, 2), (3, 3, 2),
                                                        (1, 8, 1), (4, 1, None)])
def test_rank_placement_is_tp_innermost(servers: int, gpus: int, rails: int | None) -> None:
    spec = RailSpec(servers, gpus, rails)
    r_count = rails or gpus
    assert spec.num_rails == r_count
    assert spec.num_ranks == servers * gpus
    for rank in range(spec.num_ranks):
        assert spec.server_of(rank) == rank // gpus
        assert spec.rail_of(rank) == (rank % gpus) % r_count
    on_rails = [spec.ranks_on_rail(rail) for rail in range(r_count)]
    assert sorted(r for ranks in on_rails for r in ranks) == list(range(spec.num_ranks))


def test_rank_placement_example() -> None:
    spec = RailSpec(2, 4)
    assert [spec.rail_of(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [spec.server_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert spec.ranks_on_rail(2) == [2, 6]


def test_rank_ports_k2_example() -> None:
    spec = RailSpec(3, 2, ports_per_rank=2)
    assert spec.rank_ports(3) == [RankPort(3, 1, 0, 3), RankPort(3, 1, 1, 4)]
    assert [p.port for p in spec.ports_of_rail(0)] == [1, 2, 3, 4, 5, 6]


specs = st.builds(
    lambda s, g, r_div, k: RailSpec(s, g, rails=max(1, g // r_div), ports_per_rank=k),
    st.integers(1, 6), st.integers(1, 8), st.integers(1, 4), st.sampled_from([1, 2, 4]),
)


@settings(max_examples=80, deadline=None)
@given(specs)
def test_rank_ports_are_distinct_per_rank_and_across_rail(spec: RailSpec) -> None:
    for rail in range(spec.num_rails):
        ports = spec.ports_of_rail(rail)
        numbers = [p.port for p in ports]
        assert len(numbers) == len(set(numbers)), f"rail {rail}: port used twice"
        assert all(1 <= n <= naming.MAX_PORTS_PER_RAIL for n in numbers)
        for rp in ports:
            assert rp.rail == rail
            assert spec.port_owner(rail, rp.port) == rp
    for rank in range(spec.num_ranks):
        rps = spec.rank_ports(rank)
        assert [p.port_index for p in rps] == list(range(spec.ports_per_rank))
        assert len({p.port for p in rps}) == spec.ports_per_rank
        assert all(p.rank == rank and p.rail == spec.rail_of(rank) for p in rps)


@pytest.mark.parametrize(("servers", "gpus", "rails", "k"), [(249, 1, None, 4), (1, 249, 1, 4),
                                                             (83, 3, 2, 4), (31, 8, 1, 4)])
def test_largest_specs_fit_port_and_name_limits(servers: int, gpus: int, rails: int | None,
                                                k: int) -> None:
    spec = RailSpec(servers, gpus, rails, ports_per_rank=k)
    for rail in range(spec.num_rails):
        for rp in spec.ports_of_rail(rail):
            assert rp.port <= naming.MAX_PORTS_PER_RAIL
            assert len(naming.bridge_port_intf("otfff", rail, rp.port)) <= 15
            assert len(naming.rail_intf("otfff", rp.rank, rp.port_index)) <= 15


def test_fewer_rails_than_gpus_share_rails_with_distinct_ports() -> None:
    spec = RailSpec(2, 4, rails=2, ports_per_rank=2)
    assert spec.ranks_on_rail(0) == [0, 2, 4, 6]
    assert spec.ranks_on_rail(1) == [1, 3, 5, 7]
    # ranks 0 and 2 share server 0 and rail 0 but get separate blocks of ports
    assert [p.port for p in spec.rank_ports(0)] == [1, 2]
    assert [p.port for p in spec.rank_ports(2)] == [3, 4]
    assert [p.port for p in spec.rank_ports(4)] == [5, 6]
    assert spec.port_owner(0, 4).rank == 2


def test_port_owner_unknown_port_raises() -> None:
    spec = RailSpec(2, 2)
    with pytest.raises(KeyError, match="no port 9"):
        spec.port_owner(0, 9)


def test_describe_lists_ports_and_resolved_delay_per_rail() -> None:
    spec = RailSpec(3, 2, ports_per_rank=2, switching_delay="3d-mems",
                    per_rail_delay={1: "piezo"})
    desc = spec.describe()
    assert [d.rail for d in desc] == [0, 1]
    assert desc[0].ports == (1, 2, 3, 4, 5, 6)
    assert desc[1].ports == (1, 2, 3, 4, 5, 6)
    assert desc[0].switching_delay_ms == 15.0
    assert desc[1].switching_delay_ms == 25.0
    assert all(d.mode == "ocs" for d in desc)
    assert spec.delay_ms(0) == 15.0 and spec.delay_ms(1) == 25.0


def test_describe_uses_numeric_delay_and_mode() -> None:
    spec = RailSpec(2, 3, rails=1, switching_delay=7, mode="electrical")
    (d,) = spec.describe()
    assert d.switching_delay_ms == 7.0
    assert d.mode == "electrical"
    assert d.ports == tuple(p.port for p in spec.ports_of_rail(0))
    assert len(d.ports) == 6


def test_spares_are_hosts_after_the_ranks_with_dark_ports_on_their_rail() -> None:
    spec = RailSpec(3, 2, ports_per_rank=2, spares_per_server=1, spare_servers=1)
    assert spec.num_ranks == 6 and len(spec.spares) == 5 and spec.num_hosts == 11
    described = {d.rail: d.ports for d in spec.describe()}
    for host in range(spec.num_ranks, spec.num_hosts):
        ports = spec.host_ports(host)
        assert [p.port_index for p in ports] == [0, 1] and {p.rank for p in ports} == {host}
        assert all(p.port in described[p.rail] for p in ports)
        assert spec.host_name("ot1a2", host) == f"ot1a2x{host - 6}"
        assert spec.host_rail_intf("ot1a2", host, 1) == f"ot1a2x{host - 6}-eth2"
    rank_ports = {(p.rail, p.port) for r in range(6) for p in spec.rank_ports(r)}
    spare_ports = {(p.rail, p.port) for h in range(6, 11) for p in spec.host_ports(h)}
    assert not rank_ports & spare_ports
    assert [spec.host_server(h) for h in range(6, 11)] == [0, 1, 2, 3, 3]  # spare server: 3


def test_too_many_spares_are_refused() -> None:
    with pytest.raises(ValueError, match="spares do not fit"):
        RailSpec(200, 1, spare_servers=100)
    with pytest.raises(ValueError, match=">= 0"):
        RailSpec(2, 1, spares_per_server=-1)


def test_shadow_rails_follow_the_data_rails_with_three_ports() -> None:
    """Rail-state: rails x bits shadow rails after the data rails, each switching at its data
    rail's delay (shadow id = rails + rail * bits + bit)."""
    spec = RailSpec(4, 2, switching_delay=50, per_rail_delay={1: "piezo"}, shadow_rails=4,
                    mode="electrical")
    desc = spec.describe()
    assert [d.rail for d in desc] == [0, 1, 2, 3, 4, 5]
    assert all(d.ports == (1, 2, 3) for d in desc[2:])
    assert [d.mode for d in desc] == ["electrical"] * 2 + ["ocs"] * 4
    assert [d.switching_delay_ms for d in desc] == [50.0, 25.0, 50.0, 50.0, 25.0, 25.0]
    with pytest.raises(ValueError, match="shadow_rails must be a multiple of the 2 rails"):
        RailSpec(4, 2, shadow_rails=3)
