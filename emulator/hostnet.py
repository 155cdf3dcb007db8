"""Host side of the emulation: interface set-up, link shaping and routes that follow the circuits.

Pure functions build the shell commands (the rank's end of each rail link and the bridge's end
are shaped as :mod:`emulator.shaping` says); :class:`HostRouter` runs them in the ranks' Mininet
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
from emulator.shaping import shaping_commands
from emulator.topo import RailSpec, RankPort

#: Bytes a TCP socket may leave queued below it (TCP small queues), as milliseconds of the
#: shaped link rate, and the floor in bytes (three full frames). The kernel default (4 MiB
#: here) lets one socket fill the link's HTB queue with a second or more of data at a few
#: Mbit/s. With one FIFO per link a rank's ACKs for the peer's data waited behind it:
#: ``opus-testbed bench tcp`` (2 MB flows at 8 Mbit/s, 6 MB at 25), both ways at once, flow
#: time over ideal, median 1.03 and 1.04 with this cap against 1.14 and 1.19 with the
#: kernel's. Now that ACKs go first (:mod:`emulator.shaping`) the cap matters less: 250 KB
#: flows at 8 Mbit/s, both ways, median 1.04 against 1.05-1.06 (two runs).
TCP_QUEUE_MS = 4.0
TCP_QUEUE_MIN_BYTES = 3 * 1514


def tcp_queue_limit_bytes(link_mbps: float) -> int:
    """``net.ipv4.tcp_limit_output_bytes`` for a rank whose rail ports run at ``link_mbps``."""
    return max(TCP_QUEUE_MIN_BYTES, round(link_mbps * 1e6 / 8 * TCP_QUEUE_MS / 1e3))


def interface_setup_commands(spec: RailSpec, prefix: str, host: int) -> list[str]:
    """Commands that prepare one host's namespace: offloads, sysctls, rail addresses.

    ``host`` is a rank (which gets its address on every rail port) or a spare (host ``N + j``:
    dark, no address until it takes over a rank, :meth:`HostRouter.assign`).
    """
    spare = host >= spec.num_ranks
    fe = (naming.spare_frontend_intf(prefix, host - spec.num_ranks) if spare
          else naming.frontend_intf(prefix, host))
    intfs = [fe] + [spec.host_rail_intf(prefix, host, p.port_index)
                    for p in spec.host_ports(host)]
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
    if spec.link_mbps is not None:  # a spare's links are shaped before it takes over a rank
        for intf in intfs[1:]:
            cmds += shaping_commands(intf, spec.link_mbps, spec.shaping)
    if spare:
        return cmds
    addr = naming.rank_address(host)
    for p in spec.rank_ports(host):
        intf = naming.rail_intf(prefix, host, p.port_index)
        cmds.append(f"ip addr replace {addr}/32 dev {intf}")
    return cmds


def bridge_shaping_commands(spec: RailSpec, prefix: str) -> list[str]:
    """``tc`` commands (root namespace) that shape the bridge's end of every rail link (the
    ranks' and the spares')."""
    if spec.link_mbps is None:
        return []
    return [cmd for host in range(spec.num_hosts) for p in spec.host_ports(host)
            for cmd in shaping_commands(naming.bridge_port_intf(prefix, p.rail, p.port),
                                        spec.link_mbps, spec.shaping)]


def identity_commands(spec: RailSpec, prefix: str, host: int, rank: int) -> list[str]:
    """Commands that make ``host`` answer as ``rank`` on its rail ports: ``rank``'s MACs and
    address, nothing left of an earlier identity. Peers keep their routes and neighbour entries;
    the circuits bring their frames here."""
    lines = []
    for p in spec.host_ports(host):
        intf = spec.host_rail_intf(prefix, host, p.port_index)
        lines += [f"addr flush dev {intf}", f"route flush dev {intf}", f"neigh flush dev {intf}",
                  f"link set dev {intf} address {naming.rail_mac(rank, p.port_index)}",
                  f"addr replace {naming.rank_address(rank)}/32 dev {intf}"]
    # one `ip` process for all of them: on the failover's critical path
    return ["printf '%s\\n' " + " ".join(f"'{line}'" for line in lines) + " | ip -batch -"]


def route_commands(prefix: str, local: RankPort, peer: RankPort, intf: str | None = None,
                   rto_min_ms: float | None = None) -> list[str]:
    """Point ``local.rank``'s route to ``peer.rank`` through ``local``'s port (``intf``: the
    interface of that port when another host carries ``local.rank``'s identity);
    ``rto_min_ms``: TCP's minimum retransmission timeout on that route (None: the kernel's)."""
    intf = intf or naming.rail_intf(prefix, local.rank, local.port_index)
    dst = naming.rank_address(peer.rank)
    src = naming.rank_address(local.rank)
    mac = naming.rail_mac(peer.rank, peer.port_index)
    rto = "" if rto_min_ms is None else f" rto_min {round(rto_min_ms)}ms"
    return [
        f"ip neigh replace {dst} lladdr {mac} dev {intf} nud permanent",
        f"ip route replace {dst}/32 dev {intf} src {src}{rto}",
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

    ``run(host, commands)`` executes shell commands in a host's namespace (the Mininet host
    shell; hosts are ranks, then spares: :meth:`RailSpec.host_ports`); calls for one host are
    serialised, different hosts proceed in parallel. A rank's identity lives on its own host
    until :meth:`assign` moves it to a spare.
    """

    def __init__(self, spec: RailSpec, prefix: str,
                 run: Callable[[int, Sequence[str]], None]) -> None:
        self.spec = spec
        self.prefix = prefix
        self._run = run
        self._locks = {h: threading.Lock() for h in range(spec.num_hosts)}
        self._route: dict[tuple[int, int], tuple[int, int]] = {}  # (host, peer) -> ports
        self._host_of = {r: r for r in range(spec.num_ranks)}  # rank -> host carrying it
        self._rank_on: dict[int, int] = dict(self._host_of)  # host -> the rank it carries
        self._port_host = {(p.rail, p.port): (h, p.port_index) for h in range(spec.num_hosts)
                           for p in spec.host_ports(h)}

    def host_of(self, rank: int) -> int:
        return self._host_of[rank]

    def install_static(self) -> None:
        for rank, pairs in static_routes(self.spec).items():
            self._point(rank, [(local.port_index, peer) for local, peer in pairs])

    def assign(self, rank: int, host: int) -> None:
        """Move ``rank``'s identity to ``host`` (a spare, or a repaired host): its MACs and
        address, and its static routes; the host it leaves answers as nobody."""
        old = self._host_of[rank]
        self._rank_on.pop(old, None)
        self._rank_on.pop(host, None)
        with self._locks[host]:
            self._route = {k: v for k, v in self._route.items() if k[0] not in (old, host)}
            self._run(host, identity_commands(self.spec, self.prefix, host, rank))
        self._host_of[rank] = host
        self._rank_on[host] = rank
        pairs = static_routes(self.spec).get(rank, [])
        self._point(host, [(local.port_index, peer) for local, peer in pairs])

    def release(self, host: int) -> None:
        """``host`` failed: no route is pointed from it any more (until :meth:`assign`)."""
        self._rank_on.pop(host, None)

    def on_circuits(self, reconfs: Sequence[Reconfiguration]) -> None:
        """Repoint the routes of ranks whose ports get new circuits (driver hook)."""
        if self.spec.ports_per_rank == 1:
            return  # every route is static
        per_host: dict[int, list[tuple[int, RankPort]]] = {}
        for reconf in reconfs:
            if reconf.rail >= self.spec.num_rails:
                continue  # a rail-state shadow rail: no host behind its ports
            for circuit in reconf.add:
                end_a = self._port_host.get((reconf.rail, circuit.port_a))
                end_b = self._port_host.get((reconf.rail, circuit.port_b))
                if end_a is None or end_b is None:
                    continue
                (ha, ka), (hb, kb) = end_a, end_b
                ra, rb = self._rank_on.get(ha), self._rank_on.get(hb)
                if ra is None or rb is None:
                    continue  # a dark spare's port: nobody to route
                per_host.setdefault(ha, []).append((ka, RankPort(rb, reconf.rail, kb, 0)))
                per_host.setdefault(hb, []).append((kb, RankPort(ra, reconf.rail, ka, 0)))
        threads = [threading.Thread(target=self._point, args=(host, pairs))
                   for host, pairs in per_host.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _point(self, host: int, pairs: Iterable[tuple[int, RankPort]]) -> None:
        """Routes of the rank on ``host``: (its local port index, the peer's port) each."""
        cmds: list[str] = []
        with self._locks[host]:
            rank = self._rank_on.get(host)
            if rank is None:
                return
            for k, peer in pairs:
                key = (host, peer.rank)
                ports = (k, peer.port_index)
                if self._route.get(key) == ports:
                    continue
                local = RankPort(rank, peer.rail, k, 0)
                cmds += route_commands(self.prefix, local, peer,
                                       self.spec.host_rail_intf(self.prefix, host, k),
                                       self.spec.tcp_rto_min_ms)
                self._route[key] = ports
            if cmds:
                self._run(host, cmds)


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
