"""emulator.naming: names fit IFNAMSIZ, are recognisably ours, addresses and ids are unique."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator import naming

IFNAMSIZ_MAX = 15  # Linux IFNAMSIZ is 16 including the terminating NUL
MAX_RANK = naming.MAX_EMULATED_RANKS - 1
MAX_RAIL = 15
MAX_PORT = naming.MAX_PORTS_PER_RAIL
MAX_PORT_INDEX = 3  # K <= 4
MAX_SHADOW = 999  # rail-state shadow rails: rails + rails * stages stays far below

prefixes = st.integers(0, 0xFFF).map(lambda n: f"ot{n:03x}")
FIXED_PREFIXES = ["ot000", "ot1a2", "otfff"]


def all_names(prefix: str, rank: int, rail: int, port: int, k: int) -> list[str]:
    """Every bridge/interface name the project creates for these indices."""
    return [
        naming.host_name(prefix, rank),
        naming.frontend_intf(prefix, rank),
        naming.rail_intf(prefix, rank, k),
        naming.rail_bridge(prefix, rail),
        naming.bridge_port_intf(prefix, rail, port),
        naming.frontend_bridge(prefix),
        f"{naming.root_node(prefix)}-eth0",
        naming.root_node(prefix),
        naming.shadow_bridge(prefix, MAX_SHADOW),
        naming.shadow_port_intf(prefix, MAX_SHADOW, 3),
    ]


@pytest.mark.parametrize("prefix", FIXED_PREFIXES)
def test_largest_names_fit_ifnamsiz(prefix: str) -> None:
    for name in all_names(prefix, MAX_RANK, MAX_RAIL, MAX_PORT, MAX_PORT_INDEX):
        assert len(name) <= IFNAMSIZ_MAX, name


def test_spare_names_are_ours_and_fit() -> None:
    for name in (naming.spare_name("otfff", 248), naming.spare_frontend_intf("otfff", 248),
                 naming.spare_rail_intf("otfff", 248, 3)):
        assert len(name) <= IFNAMSIZ_MAX and naming.prefix_of(name) == "otfff"
    assert naming.spare_rail_intf("ot1a2", 0, 1) == "ot1a2x0-eth2"
    macs = {naming.spare_rail_mac(j, k) for j in range(249) for k in range(4)}
    assert len(macs) == 249 * 4
    assert not macs & {naming.rail_mac(r, k) for r in range(249) for k in range(4)}


def test_names_are_as_documented() -> None:
    assert naming.host_name("ot1a2", 7) == "ot1a2g7"
    assert naming.frontend_intf("ot1a2", 7) == "ot1a2g7-eth0"
    assert naming.rail_intf("ot1a2", 7, 0) == "ot1a2g7-eth1"
    assert naming.rail_intf("ot1a2", 7, 3) == "ot1a2g7-eth4"
    assert naming.rail_bridge("ot1a2", 3) == "ot1a2r3"
    assert naming.bridge_port_intf("ot1a2", 3, 12) == "ot1a2r3-eth12"
    assert naming.frontend_bridge("ot1a2") == "ot1a2fe"
    assert naming.root_node("ot1a2") == "ot1a2root"
    assert naming.shadow_bridge("ot1a2", 5) == "ot1a2s5"
    assert naming.shadow_port_intf("ot1a2", 5, 3) == "ot1a2s5-eth3"


@given(prefixes, st.integers(0, MAX_RANK), st.integers(0, MAX_RAIL), st.integers(1, MAX_PORT),
       st.integers(0, MAX_PORT_INDEX))
def test_every_name_fits_is_owned_and_gives_back_prefix(
    prefix: str, rank: int, rail: int, port: int, k: int
) -> None:
    for name in all_names(prefix, rank, rail, port, k):
        assert len(name) <= IFNAMSIZ_MAX, name
        assert naming.OWNED_NAME_RE.match(name), name
        assert naming.prefix_of(name) == prefix


def test_names_of_different_objects_differ() -> None:
    names = [naming.rail_intf("ot1a2", r, k) for r in range(MAX_RANK + 1) for k in range(4)]
    names += [naming.frontend_intf("ot1a2", r) for r in range(MAX_RANK + 1)]
    names += [naming.bridge_port_intf("ot1a2", rail, p) for rail in range(16)
              for p in range(1, MAX_PORT + 1)]
    names += [naming.rail_bridge("ot1a2", rail) for rail in range(16)]
    names += [naming.frontend_bridge("ot1a2"), naming.root_node("ot1a2")]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    "name",
    ["eth0", "lo", "ovs-system", "br-int", "br0", "otherbr", "ot12-eth0", "ot1234g1", "ot1a2",
     "OT1A2g1", "ot1a2q1", "ot1a2g", "ot1a2r-eth1", "ot1a2g1-eth", "ot1a2g1-ens3", "xot1a2g1",
     "ot1a2g1-eth0.5", "ot1g2g1", "docker0", "virbr0", "s1-eth1", "h1-eth0", "veth1a2b3c"],
)
def test_foreign_names_are_not_ours(name: str) -> None:
    assert not naming.OWNED_NAME_RE.match(name)
    assert naming.prefix_of(name) is None


def test_prefix_re_accepts_only_run_prefixes() -> None:
    assert naming.PREFIX_RE.match("ot1a2")
    for bad in ("ot1a", "ot1a23", "OT1A2", "ot1g2", "xx1a2"):
        assert not naming.PREFIX_RE.match(bad)


def test_new_prefix_is_well_formed() -> None:
    for _ in range(50):
        assert naming.PREFIX_RE.match(naming.new_prefix())


def test_new_prefix_avoids_taken_ones() -> None:
    free = {"ot000", "ot7ab", "otfff", "ot123", "ot456", "ot789", "otabc", "otdef"}
    taken = [f"ot{n:03x}" for n in range(0x1000) if f"ot{n:03x}" not in free]
    got = {naming.new_prefix(taken) for _ in range(20)}
    assert got <= free


def test_new_prefix_raises_when_all_taken() -> None:
    taken = (f"ot{n:03x}" for n in range(0x1000))
    with pytest.raises(RuntimeError, match="clean"):
        naming.new_prefix(taken)


def test_rank_and_frontend_addresses_unique_and_in_benchmark_range() -> None:
    bench = ipaddress.ip_network("198.18.0.0/15")
    slot = 17
    addrs = [naming.rank_address(r) for r in range(naming.MAX_EMULATED_RANKS)]
    fronts = [naming.frontend_address(slot, r) for r in range(250)]
    root = naming.frontend_root_address(slot)
    everything = [*addrs, *fronts, root]
    assert len(set(everything)) == len(everything)
    for a in everything:
        ip = ipaddress.ip_address(a)
        assert ip in bench, a
        assert not a.endswith((".0", ".255")), a
    assert all(a.startswith("198.18.17.") for a in [*fronts, root])
    assert naming.rank_address(0) == "198.19.0.1"
    assert naming.rank_address(249) == "198.19.0.250"
    assert naming.rank_address(250) == "198.19.1.1"


@pytest.mark.parametrize("slot", [0, 255])
def test_frontend_addresses_of_extreme_slots_are_valid(slot: int) -> None:
    """The slot's /24 holds its ranks' and the root's addresses, none a network or broadcast
    address, all distinct and inside the benchmarking range."""
    subnet = ipaddress.ip_network(f"198.18.{slot}.0/24")
    addrs = [naming.frontend_address(slot, r) for r in (0, 249)]
    addrs.append(naming.frontend_root_address(slot))
    ips = [ipaddress.ip_address(a) for a in addrs]
    assert len(set(ips)) == len(ips), addrs
    for ip in ips:
        assert ip in subnet and ip in ipaddress.ip_network("198.18.0.0/15"), ip
        assert ip not in (subnet.network_address, subnet.broadcast_address), ip


@pytest.mark.parametrize("rank", [-1, 250, 1000])
def test_frontend_address_rejects_ranks_out_of_range(rank: int) -> None:
    with pytest.raises(ValueError, match=r"0\.\.249"):
        naming.frontend_address(0, rank)


MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def test_macs_unique_well_formed_and_locally_administered_unicast() -> None:
    macs = [naming.rail_mac(r, k) for r in range(naming.MAX_EMULATED_RANKS) for k in range(4)]
    macs += [naming.frontend_mac(r) for r in range(naming.MAX_EMULATED_RANKS)]
    assert len(macs) == len(set(macs))
    for mac in macs:
        assert MAC_RE.match(mac), mac
        first = int(mac[:2], 16)
        assert first & 0x02, f"{mac} is not locally administered"
        assert not first & 0x01, f"{mac} is multicast"
    assert naming.rail_mac(0x1AB, 2) == "02:0f:01:ab:02:01"


def test_dpid_distinct_per_rail_and_prefix() -> None:
    ids = [naming.dpid(f"ot{p:03x}", rail) for p in range(0x1000) for rail in range(16)]
    assert len(ids) == len(set(ids))
    for d in ids[:64]:
        assert len(d) == 16 and int(d, 16) > 0


