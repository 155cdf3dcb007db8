"""Host side of the emulation: interface set-up and routes that follow the circuits.

Pure functions build the shell commands; :class:`HostRouter` runs them in the ranks' Mininet
shells. The scheme (see :mod:`emulator.naming`): a rank's address is a /32 on each of its rail
interfaces; a peer is reached by a /32 route through the local port whose circuit leads to it,
with a permanent neighbour entry for the peer port's MAC (no ARP on the rails, IPv6 off, so a
rail carries only the traffic we send). With one port per rank the route to every rail peer is
fixed, so it is installed once; with K > 1 ports it is repointed whenever a circuit lights.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from controller.ocs import Reconfiguration
from emulator import naming
from emulator.topo import RailSpec, RankPort

#: Bytes a TCP socket may leave queued below it (TCP small queues), as milliseconds of the
#: shaped link rate, and the floor in bytes (three full frames). The kernel default (4 MiB
#: here) lets one socket fill the link's HTB queue with a second or more of data at a few
#: Mbit/s; a rank's ACKs for the peer's data then wait behind it. ``opus-testbed bench tcp``
#: (2 MB flows at 8 Mbit/s, 6 MB at 25): both ways at once, flow time over ideal, median 1.03
#: and 1.04 with this cap against 1.14 and 1.19 with the kernel's; one way 1.00 either way.
TCP_QUEUE_MS = 4.0
TCP_QUEUE_MIN_BYTES = 3 * 1514


def tcp_queue_limit_bytes(link_mbps: float) -> int:
    """``net.ipv4.tcp_limit_output_bytes`` for a rank whose rail ports run at ``link_mbps``."""
    return max(TCP_QUEUE_MIN_BYTES, round(link_mbps * 1e6 / 8 * TCP_QUEUE_MS / 1e3))


def interface_setup_commands(spec: RailSpec, prefix: str, rank: int) -> list[str]:
    """Commands that prepare one rank's namespace: offloads, sysctls, rail addresses."""
    intfs = [naming.frontend_intf(prefix, rank)] + [
        naming.rail_intf(prefix, rank, p.port_index) for p in spec.rank_ports(rank)
    ]
    cmds = [
        "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1",
        "sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0",
        "sysctl -qw net.ipv4.conf.all.arp_ignore=1",
    ]
    if spec.link_mbps is not None:  # per network namespace: the machine's own value is kept
        cmds.append("sysctl -qw net.ipv4.tcp_limit_output_bytes="
                    f"{tcp_queue_limit_bytes(spec.link_mbps)}")
    for intf in intfs:
        # Userspace OVS forwards frames with partial checksums as they are: TCP would stall.
        cmds.append(f"ethtool -K {intf} tx off >/dev/null 2>&1")
        cmds.append(f"sysctl -qw net.ipv4.conf.{intf}.rp_filter=0")
    addr = naming.rank_address(rank)
    for p in spec.rank_ports(rank):
        intf = naming.rail_intf(prefix, rank, p.port_index)
        cmds.append(f"ip addr replace {addr}/32 dev {intf}")
    return cmds


def route_commands(prefix: str, local: RankPort, peer: RankPort) -> list[str]:
    """Point ``local.rank``'s route to ``peer.rank`` through ``local``'s port."""
    intf = naming.rail_intf(prefix, local.rank, local.port_index)
    dst = naming.rank_address(peer.rank)
    src = naming.rank_address(local.rank)
    mac = naming.rail_mac(peer.rank, peer.port_index)
    return [
        f"ip neigh replace {dst} lladdr {mac} dev {intf} nud permanent",
        f"ip route replace {dst}/32 dev {intf} src {src}",
    ]


def static_routes(spec: RailSpec) -> dict[int, list[tuple[RankPort, RankPort]]]:
    """Routes that never change: (local port, peer port) per rank.

    Electrical rails reach every peer all the time (port ``(x + y) % K`` on both sides); OCS
    rails with one port per rank have only one way to any peer. OCS rails with K > 1 start
    without routes: circuits install them.
    """
    out: dict[int, list[tuple[RankPort, RankPort]]] = {r: [] for r in range(spec.num_ranks)}
    if spec.mode == "ocs" and spec.ports_per_rank > 1:
        return out
    for rail in range(spec.num_rails):
        ranks = spec.ranks_on_rail(rail)
        for x in ranks:
            for y in ranks:
                if x == y:
                    continue
                k = (x + y) % spec.ports_per_rank
                out[x].append((spec.rank_ports(x)[k], spec.rank_ports(y)[k]))
    return out


class HostRouter:
    """Keeps each rank's routes pointed at its current circuit peers.

    ``run(rank, commands)`` executes shell commands in the rank's namespace (the Mininet host
    shell); calls for one rank are serialised, different ranks proceed in parallel.
    """

    def __init__(self, spec: RailSpec, prefix: str,
                 run: Callable[[int, Sequence[str]], None]) -> None:
        self.spec = spec
        self.prefix = prefix
        self._run = run
        self._locks = {r: threading.Lock() for r in range(spec.num_ranks)}
        self._route: dict[tuple[int, int], tuple[int, int]] = {}  # (rank, peer) -> ports

    def install_static(self) -> None:
        for rank, pairs in static_routes(self.spec).items():
            self._point(rank, pairs)

    def on_circuits(self, reconfs: Sequence[Reconfiguration]) -> None:
        """Repoint the routes of ranks whose ports get new circuits (driver hook)."""
        if self.spec.ports_per_rank == 1:
            return  # every route is static
        per_rank: dict[int, list[tuple[RankPort, RankPort]]] = {}
        for reconf in reconfs:
            if reconf.rail >= self.spec.num_rails:
                continue  # a rail-state shadow rail: no host behind its ports
            for circuit in reconf.add:
                a = self.spec.port_owner(reconf.rail, circuit.port_a)
                b = self.spec.port_owner(reconf.rail, circuit.port_b)
                per_rank.setdefault(a.rank, []).append((a, b))
                per_rank.setdefault(b.rank, []).append((b, a))
        threads = [threading.Thread(target=self._point, args=(rank, pairs))
                   for rank, pairs in per_rank.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _point(self, rank: int, pairs: Iterable[tuple[RankPort, RankPort]]) -> None:
        cmds: list[str] = []
        with self._locks[rank]:
            for local, peer in pairs:
                key = (rank, peer.rank)
                ports = (local.port_index, peer.port_index)
                if self._route.get(key) == ports:
                    continue
                cmds += route_commands(self.prefix, local, peer)
                self._route[key] = ports
            if cmds:
                self._run(rank, cmds)


#: Mininet types commands into a pty shell; a tty line holds at most 4096 bytes, and a longer
#: one is cut silently, leaving the shell waiting forever. Longer scripts go through a file.
MAX_INLINE_BYTES = 2000


def shell_runner(hosts: dict[int, Any], scratch_dir: Path) -> Callable[[int, Sequence[str]], None]:
    """Run commands in Mininet host shells; raises if any command fails."""

    def run(rank: int, cmds: Sequence[str]) -> None:
        script = " && ".join(f"{{ {c}; }}" for c in cmds)
        if len(script) > MAX_INLINE_BYTES:
            path = scratch_dir / f"host-setup-rank{rank}-{threading.get_ident()}.sh"
            path.write_text("set -e\n" + "\n".join(cmds) + "\n")
            script = f"sh {shlex.quote(str(path))}"
        out = hosts[rank].cmd(f"{script} && echo __ok__ || echo __failed__")
        if "__ok__" not in out:
            raise RuntimeError(f"rank {rank}: host set-up failed: {out.strip()[-500:]}")

    return run
