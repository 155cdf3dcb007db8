"""Rail-state's shadow ports as veth pairs, so that the wire check can probe and capture them.

Under rail-state the bits switch on small shadow OCS bridges (:mod:`controller.railstate`,
three ports each) with no host behind them. To put frames through them each shadow port is a
veth pair: the bridge side ``ot1a2s<id>-eth<p>`` (in the root namespace, where ``tcpdump``
listens like on a data rail's port) and the far end ``s<id>p<p>`` with address
:func:`emulator.naming.shadow_mac`, in the run's one shadow namespace ``ot1a2sh``, which the
run records and removes by name (:mod:`emulator.runstate`). Only the probe frames of the wire
check (:mod:`emulator.wirecap`) are sent there; IPv6 is off in the namespace so that the kernel
sends nothing of its own, and the far ends carry no address; the bridge sides get IPv6 off too
(:func:`near_ends`) before they come up, or the root namespace's kernel sends its router
solicitations and multicast reports out of them.

This module only builds the commands (pure); :mod:`emulator.network` runs them.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.railstate import SHADOW_PORTS
from emulator import naming


def shadow_port_ids(shadow_ids: Iterable[int]) -> list[tuple[int, int]]:
    """Every (shadow rail, port) of a run, in rail then port order."""
    return [(rail, port) for rail in shadow_ids for port in SHADOW_PORTS]


def netns_setup_commands(prefix: str) -> list[list[str]]:
    """Create the shadow namespace with IPv6 off (before any interface enters it, so that
    ``default`` applies to them)."""
    ns = naming.shadow_netns(prefix)
    return [["ip", "netns", "add", ns],
            ["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
             "net.ipv6.conf.all.disable_ipv6=1", "-w", "net.ipv6.conf.default.disable_ipv6=1"]]


def near_ends(prefix: str, shadow_ids: Iterable[int]) -> list[str]:
    """The bridge sides (root namespace) of every shadow port."""
    return [naming.shadow_port_intf(prefix, rail, port)
            for rail, port in shadow_port_ids(shadow_ids)]


def veth_batch(prefix: str, shadow_ids: Iterable[int]) -> str:
    """``ip -batch`` lines (root namespace): each shadow port's veth pair, the far end made
    directly in the shadow namespace with its address; both ends down."""
    ns = naming.shadow_netns(prefix)
    return "".join(
        f"link add {naming.shadow_port_intf(prefix, rail, port)} type veth peer name "
        f"{naming.shadow_peer_intf(rail, port)} address {naming.shadow_mac(rail, port)} "
        f"netns {ns}\n" for rail, port in shadow_port_ids(shadow_ids))


def near_end_batch(prefix: str, shadow_ids: Iterable[int]) -> str:
    """``ip -batch`` lines (root namespace): every bridge side up."""
    return "".join(f"link set {name} up\n" for name in near_ends(prefix, shadow_ids))


def far_end_batch(shadow_ids: Iterable[int]) -> str:
    """``ip -n <shadow namespace> -batch`` lines: every far end up."""
    return "".join(f"link set {naming.shadow_peer_intf(rail, port)} up\n"
                   for rail, port in shadow_port_ids(shadow_ids))


def probe_targets(prefix: str, shadow_ids: Iterable[int],
                  netns_dir: str = "/var/run/netns") -> list[tuple[str, str]]:
    """(namespace path, interface) of every shadow port's far end, for
    :func:`emulator.probe.send_many`."""
    ns_path = f"{netns_dir}/{naming.shadow_netns(prefix)}"
    return [(ns_path, naming.shadow_peer_intf(rail, port))
            for rail, port in shadow_port_ids(shadow_ids)]
