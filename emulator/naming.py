"""The naming scheme of an emulated photonic-rail network, written once.

Every object a run creates carries the run's prefix ``ot<xxx>`` (three hex digits, random per
run, unique among live runs), so concurrent runs never collide and ``opus-testbed clean`` can
tell our leftovers from anybody else's. With prefix ``ot1a2``:

=================  ====================  ===================================================
object             name                  notes
=================  ====================  ===================================================
rank host          ``ot1a2g<rank>``      a Mininet host (own network namespace) = one GPU rank
frontend intf      ``ot1a2g<rank>-eth0`` control traffic only (controller, shims, logs)
rail intf          ``ot1a2g<rank>-eth<1+k>``  NIC port ``k`` (0..K-1) of the rank on its rail
spare host         ``ot1a2x<j>``         spare GPU ``j``; interfaces ``-eth0``, ``-eth<1+k>``
rail bridge        ``ot1a2r<rail>``      OVS bridge acting as the rail's OCS
rail bridge port   ``ot1a2r<rail>-eth<p>``  OpenFlow port ``p = server*K + k + 1``
shadow bridge      ``ot1a2s<id>``        rail-state only: the OCS of one (rail, bit), rail id
                                         ``id`` (:func:`controller.railstate.shadow_rail_id`)
shadow port        ``ot1a2s<id>-eth<p>``  its ports ``p`` = 1, 2, 3: veths whose far ends
                                         ``s<id>p<p>`` sit in the shadow namespace
shadow namespace   ``ot1a2sh``           rail-state only: one per run, the shadow ports' far
                                         ends (the wire check's probes and nothing else)
frontend bridge    ``ot1a2fe``           Linux bridge (control traffic only, kept out of OVS)
root-side intf     ``ot1a2root-eth0``    links the root namespace to the frontend bridge
=================  ====================  ===================================================

Addresses (RFC 2544 benchmarking ranges, so they never clash with a real network):

* frontend: ``198.18.<slot>.<rank+1>/24``, root namespace ``198.18.<slot>.254``, where ``slot``
  is chosen per run among subnets unused on this machine;
* rank address: ``198.19.<rank // 250>.<rank % 250 + 1>``, a /32 on each of the rank's rail
  interfaces; a peer is reached by a /32 route through the interface whose circuit leads to it.
  Rail subnets exist only inside the rank namespaces.
* MAC of the far end of shadow port ``p`` of shadow rail ``s``: ``02:0d:<s hi>:<s lo>:<p>:01``.
* MAC of rail port ``k`` of rank ``r``: ``02:0f:<r hi>:<r lo>:<k>:01``; frontend ``...:ff:01``.
* spare ``j``: frontend ``198.18.<slot>.<ranks + j + 1>``; MACs ``02:0e:<j hi>:<j lo>:...`` while
  dark. A spare that takes over rank ``r`` takes ``r``'s rail MACs and address, so its peers'
  routes and neighbour entries stay as they are; only the circuits move.

Rank ``r`` sits on server ``r // G`` with local index ``r % G`` (TP innermost, as TorchTitan and
Megatron place ranks); its rail is ``(r % G) % R``.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable

PREFIX_RE = re.compile(r"^ot[0-9a-f]{3}$")
#: Any bridge or interface name the project can create (for `clean`).
OWNED_NAME_RE = re.compile(r"^ot[0-9a-f]{3}(g\d+|r\d+|s\d+|x\d+|fe|root)(-eth\d+)?$")
#: The network namespace a run may create (rail-state's shadow ports' far ends; for `clean`).
OWNED_NETNS_RE = re.compile(r"^ot[0-9a-f]{3}sh$")
#: Highest OpenFlow port number on a rail bridge: its interface ``ot1a2r15-eth999`` fills
#: Linux's IFNAMSIZ (15 characters) with rails up to 15.
MAX_PORTS_PER_RAIL = 999
#: Ranks one emulated network can hold. A rail bridge numbers its ports ``server*K + k + 1``;
#: with one GPU per server and K = 4 ports per rank that reaches ``4 * ranks``, which must stay
#: within :data:`MAX_PORTS_PER_RAIL` (the frontend addresses would allow 250).
MAX_EMULATED_RANKS = MAX_PORTS_PER_RAIL // 4


def new_prefix(taken: Iterable[str] = ()) -> str:
    """A fresh run prefix not in ``taken``."""
    taken_set = set(taken)
    free = [p for p in (f"ot{i:03x}" for i in range(0x1000)) if p not in taken_set]
    if free:
        return secrets.choice(free)
    raise RuntimeError("no free run prefix: too many runs recorded; try `opus-testbed clean`")


def prefix_of(name: str) -> str | None:
    """The run prefix of a project-owned name, or None for anything else."""
    m = OWNED_NAME_RE.match(name)
    return name[:5] if m else None


def host_name(prefix: str, rank: int) -> str:
    return f"{prefix}g{rank}"


def spare_name(prefix: str, spare: int) -> str:
    return f"{prefix}x{spare}"


def spare_frontend_intf(prefix: str, spare: int) -> str:
    return f"{spare_name(prefix, spare)}-eth0"


def spare_rail_intf(prefix: str, spare: int, port_index: int) -> str:
    return f"{spare_name(prefix, spare)}-eth{1 + port_index}"


def spare_rail_mac(spare: int, port_index: int) -> str:
    return f"02:0e:{spare >> 8:02x}:{spare & 0xFF:02x}:{port_index:02x}:01"


def spare_frontend_mac(spare: int) -> str:
    return f"02:0e:{spare >> 8:02x}:{spare & 0xFF:02x}:ff:01"


def rail_bridge(prefix: str, rail: int) -> str:
    return f"{prefix}r{rail}"


def shadow_bridge(prefix: str, rail: int) -> str:
    """The bridge of rail-state shadow rail ``rail`` (an OCS rail id past the data rails)."""
    return f"{prefix}s{rail}"


def shadow_port_intf(prefix: str, rail: int, port: int) -> str:
    """The bridge side of shadow port ``port``: one end of a veth pair."""
    return f"{shadow_bridge(prefix, rail)}-eth{port}"


def shadow_netns(prefix: str) -> str:
    """The run's one namespace for the shadow ports' far ends (rail-state only)."""
    return f"{prefix}sh"


def shadow_peer_intf(rail: int, port: int) -> str:
    """The far end of shadow port ``port`` of shadow rail ``rail``, inside
    :func:`shadow_netns` (no prefix needed: the namespace is the run's own)."""
    return f"s{rail}p{port}"


def shadow_mac(rail: int, port: int) -> str:
    """The address of the far end of a shadow port: what the wire check's probes from it
    carry as their source (a frame with it entered the shadow switch at that port)."""
    return f"02:0d:{rail >> 8:02x}:{rail & 0xFF:02x}:{port:02x}:01"


def frontend_bridge(prefix: str) -> str:
    return f"{prefix}fe"


def root_node(prefix: str) -> str:
    return f"{prefix}root"


def frontend_intf(prefix: str, rank: int) -> str:
    return f"{host_name(prefix, rank)}-eth0"


def rail_intf(prefix: str, rank: int, port_index: int) -> str:
    return f"{host_name(prefix, rank)}-eth{1 + port_index}"


def bridge_port_intf(prefix: str, rail: int, port: int) -> str:
    return f"{rail_bridge(prefix, rail)}-eth{port}"


def rank_address(rank: int) -> str:
    return f"198.19.{rank // 250}.{rank % 250 + 1}"


def frontend_address(slot: int, rank: int) -> str:
    if not 0 <= rank < 250:
        raise ValueError(f"frontend addresses cover ranks 0..249, not {rank}")
    return f"198.18.{slot}.{rank + 1}"


def frontend_root_address(slot: int) -> str:
    return f"198.18.{slot}.254"


def frontend_network(slot: int) -> str:
    """The run's frontend subnet: its hosts and the root namespace's end, nothing else (the
    "run's own namespaces" of :mod:`controller.curve`)."""
    return f"198.18.{slot}.0/24"


def rail_mac(rank: int, port_index: int) -> str:
    return f"02:0f:{rank >> 8:02x}:{rank & 0xFF:02x}:{port_index:02x}:01"


def frontend_mac(rank: int) -> str:
    return f"02:0f:{rank >> 8:02x}:{rank & 0xFF:02x}:ff:01"


def dpid(prefix: str, rail: int) -> str:
    """Datapath id of a rail bridge, 16 hex digits, unique per run and rail."""
    return f"{0x0F << 56 | int(prefix[2:], 16) << 16 | (rail + 1):016x}"


def frontend_dpid(prefix: str) -> str:
    """Datapath id of the frontend bridge (explicit: Mininet derives one only from digits in
    the name, and a prefix such as ``otabc`` gives ``otabcfe``, which has none)."""
    return f"{0x0E << 56 | int(prefix[2:], 16) << 16:016x}"
