"""Photonic-rail topology: the static description (pure) and its Mininet ``Topo``.

:class:`RailSpec` is plain data (servers, GPUs per server, rails, ports per rank per rail, link
rate, mode, spare GPUs) and knows the mapping rank -> server/rail/ports. Hosts are numbered:
ranks ``0..N-1``, then spare ``j`` is host ``N + j`` (:meth:`RailSpec.host_ports`).
:class:`PhotonicRailTopo` turns it into Mininet nodes and links, using the names of
:mod:`emulator.naming`. The running network lives in :mod:`emulator.network`; the topology
object never starts anything. Under rail-state semantics a spec also has ``shadow_rails``:
small OCS rails (ids after the data rails, three ports each, no hosts, OCS whatever the data
rails' mode) on which the bits of the data rails switch (:mod:`controller.railstate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.job import SpareSlot, rank_rail_ports, spare_slots
from controller.ocs import RailDescription, resolve_switching_delay_ms
from controller.railstate import SHADOW_PORTS
from emulator import naming
from emulator.shaping import SHAPINGS

#: Hard limit of the emulator's link rate: the links are shaped with HTB
#: (:mod:`emulator.shaping`), whose parameters (as Mininet's TCLink, which ignores rates above
#: 1000 Mbit/s) are meant for rates up to 1 Gbit/s.
EMULATOR_MAX_LINK_MBPS = 1000.0
MODES = ("ocs", "electrical")
#: Linux's minimum TCP retransmission timeout (TCP_RTO_MIN, HZ / 5)
LINUX_TCP_RTO_MIN_MS = 200.0
#: hosts (ranks and spares) one network can hold: frontend addresses 198.18.<slot>.1..249
MAX_FRONTEND_HOSTS = 249


@dataclass(frozen=True)
class RankPort:
    """One NIC port of a rank on its rail."""

    rank: int
    rail: int
    port_index: int  # k in 0..K-1
    port: int  # OpenFlow port number on the rail bridge


@dataclass(frozen=True)
class RailSpec:
    """What to emulate: S servers x G GPUs, R rails, K ports per rank per rail."""

    servers: int
    gpus_per_server: int
    rails: int | None = None  # default: one rail per local GPU index
    ports_per_rank: int = 1  # NIC port split: 1, 2 or 4
    link_mbps: float | None = 100.0  # per-port rate (None: unshaped)
    shaping: str = "ack-priority"  # how links are shaped: see emulator.shaping.SHAPINGS
    mode: str = "ocs"  # "ocs" or "electrical"
    switching_delay: float | str = 0.0  # ms, or a Table 3 technology name
    per_rail_delay: dict[int, float | str] = field(default_factory=dict)
    shadow_rails: int = 0  # rail-state: rails x bits shadow OCS rails after the data rails
    spares_per_server: int = 0  # spare GPUs per server, dark until one takes over a rank
    spare_servers: int = 0  # whole servers of spare GPUs
    #: TCP's minimum retransmission timeout on the ranks' rail routes, wall ms (None: the
    #: kernel's :data:`LINUX_TCP_RTO_MIN_MS`); a run at time dilation k sets k x that, so that
    #: the timer keeps its model-time value as every other modelled time does
    tcp_rto_min_ms: float | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.servers < 1:
            problems.append(f"servers must be >= 1, got {self.servers}")
        if self.gpus_per_server < 1:
            problems.append(f"gpus_per_server must be >= 1, got {self.gpus_per_server}")
        if self.rails is not None and not 1 <= self.rails <= max(self.gpus_per_server, 1):
            problems.append(f"rails must be in 1..gpus_per_server ({self.gpus_per_server}), "
                            f"got {self.rails}")
        if self.ports_per_rank not in (1, 2, 4):
            problems.append(f"ports_per_rank must be 1, 2 or 4, got {self.ports_per_rank}")
        if self.link_mbps is not None and not 0 < self.link_mbps <= EMULATOR_MAX_LINK_MBPS:
            problems.append(f"link_mbps must be in (0, {EMULATOR_MAX_LINK_MBPS:g}] (Mininet's HTB "
                            "limit), "
                            f"got {self.link_mbps}")
        if self.shaping not in SHAPINGS:
            problems.append(f"shaping must be one of {SHAPINGS}, got {self.shaping!r}")
        if self.tcp_rto_min_ms is not None and not 1 <= self.tcp_rto_min_ms <= 120_000:
            problems.append(f"tcp_rto_min_ms must be in [1, 120000] (the kernel's limits), "
                            f"got {self.tcp_rto_min_ms}")
        if self.mode not in MODES:
            problems.append(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.shadow_rails < 0 or (self.num_rails > 0 and self.shadow_rails % self.num_rails):
            problems.append(f"shadow_rails must be a multiple of the {self.num_rails} rails "
                            f"(one per rail and bit), got {self.shadow_rails}")
        ranks = self.servers * self.gpus_per_server
        if ranks > naming.MAX_EMULATED_RANKS:
            problems.append(f"at most {naming.MAX_EMULATED_RANKS} ranks fit one emulated network, "
                            f"got {ranks}")
        if self.spares_per_server < 0 or self.spare_servers < 0:
            problems.append("spares_per_server and spare_servers must be >= 0")
        elif self.spares_per_server or self.spare_servers:
            last = max((p for s in self.spares for p in s.ports), default=0)
            if last > naming.MAX_PORTS_PER_RAIL or self.num_hosts > MAX_FRONTEND_HOSTS:
                problems.append(f"{len(self.spares)} spares do not fit: at most "
                                f"{MAX_FRONTEND_HOSTS} hosts and {naming.MAX_PORTS_PER_RAIL} ports "
                                "per rail")
        if problems:
            raise ValueError("; ".join(problems))
        delays: list[tuple[int | None, float | str]] = [(None, self.switching_delay)]
        delays += self.per_rail_delay.items()
        for rail, value in delays:
            try:
                resolve_switching_delay_ms(value)
            except ValueError as exc:
                where = "switching_delay" if rail is None else f"per_rail_delay[{rail}]"
                raise ValueError(f"{where}: {exc}") from None
        bad_rails = [r for r in self.per_rail_delay if not 0 <= r < self.num_rails]
        if bad_rails:
            raise ValueError(
                f"per_rail_delay names rails {bad_rails} outside 0..{self.num_rails - 1}")

    @property
    def num_rails(self) -> int:
        return self.rails if self.rails is not None else self.gpus_per_server

    @property
    def num_ranks(self) -> int:
        return self.servers * self.gpus_per_server

    @property
    def spares(self) -> list[SpareSlot]:
        return spare_slots(self.servers, self.gpus_per_server, self.ports_per_rank,
                           self.num_rails, spares_per_server=self.spares_per_server,
                           spare_servers=self.spare_servers)

    @property
    def num_hosts(self) -> int:
        """Ranks and spares: the Mininet hosts that run GPUs."""
        return self.num_ranks + len(self.spares)

    def host_ports(self, host: int) -> list[RankPort]:
        """The rail ports of host ``host`` (a rank's own, or spare ``host - N``'s); ``rank`` of
        each is the host number."""
        if host < self.num_ranks:
            return self.rank_ports(host)
        spare = self.spares[host - self.num_ranks]
        return [RankPort(host, spare.rail, k, p) for k, p in enumerate(spare.ports)]

    def host_rail_intf(self, prefix: str, host: int, port_index: int) -> str:
        if host < self.num_ranks:
            return naming.rail_intf(prefix, host, port_index)
        return naming.spare_rail_intf(prefix, host - self.num_ranks, port_index)

    def host_name(self, prefix: str, host: int) -> str:
        if host < self.num_ranks:
            return naming.host_name(prefix, host)
        return naming.spare_name(prefix, host - self.num_ranks)

    def host_server(self, host: int) -> int:
        if host < self.num_ranks:
            return self.server_of(host)
        return self.spares[host - self.num_ranks].server

    def server_of(self, rank: int) -> int:
        return rank // self.gpus_per_server

    def rail_of(self, rank: int) -> int:
        return (rank % self.gpus_per_server) % self.num_rails

    def ranks_on_rail(self, rail: int) -> list[int]:
        return [r for r in range(self.num_ranks) if self.rail_of(r) == rail]

    def rank_ports(self, rank: int) -> list[RankPort]:
        """The K ports of ``rank`` on its rail, in NIC port order."""
        rp = rank_rail_ports(rank, self.gpus_per_server, self.ports_per_rank, self.num_rails)
        return [RankPort(rank, rp.rail, k, port) for k, port in enumerate(rp.ports)]

    def ports_of_rail(self, rail: int) -> list[RankPort]:
        return [p for r in self.ranks_on_rail(rail) for p in self.rank_ports(r)]

    def port_owner(self, rail: int, port: int) -> RankPort:
        for p in self.ports_of_rail(rail):
            if p.port == port:
                return p
        raise KeyError(f"rail {rail} has no port {port}")

    @property
    def shadow_ids(self) -> range:
        return range(self.num_rails, self.num_rails + self.shadow_rails)

    def delay_ms(self, rail: int) -> float:
        """A rail's switching delay; a shadow rail switches at its data rail's."""
        if rail >= self.num_rails:
            rail = (rail - self.num_rails) // (self.shadow_rails // self.num_rails)
        return resolve_switching_delay_ms(self.per_rail_delay.get(rail, self.switching_delay))

    def describe(self) -> list[RailDescription]:
        """Every rail with its ports: the ranks', then the spares' (dark until used)."""
        spare_ports: dict[int, list[int]] = {}
        for s in self.spares:
            spare_ports.setdefault(s.rail, []).extend(s.ports)
        return [
            RailDescription(rail, tuple(p.port for p in self.ports_of_rail(rail))
                            + tuple(spare_ports.get(rail, ())), self.delay_ms(rail), self.mode)
            for rail in range(self.num_rails)
        ] + [RailDescription(s, SHADOW_PORTS, self.delay_ms(s), "ocs")  # always switched
             for s in self.shadow_ids]


def build_topo(spec: RailSpec, prefix: str, slot: int, rail_switch: Any = None,
               frontend_switch: Any = None) -> Any:
    """A Mininet ``Topo`` for ``spec``; Mininet is imported lazily so pure users never load it.

    ``rail_switch``/``frontend_switch`` are the Mininet switch classes (the network picks the
    datapath); ``slot`` picks the frontend subnet. Links come unshaped: the network shapes both
    ends of each rail link (:func:`emulator.hostnet.interface_setup_commands`,
    :func:`emulator.hostnet.bridge_shaping_commands`).
    """
    from mininet.topo import Topo

    rail_opts: dict[str, Any] = {"cls": rail_switch} if rail_switch else {}
    fe_opts: dict[str, Any] = {"cls": frontend_switch} if frontend_switch else {}

    class PhotonicRailTopo(Topo):
        """One host per rank, one bridge per rail, one frontend bridge and the root link."""

        def build(self, **_params: Any) -> None:
            fe = self.addSwitch(naming.frontend_bridge(prefix), dpid=naming.frontend_dpid(prefix),
                                **fe_opts)
            root = self.addHost(naming.root_node(prefix), inNamespace=False,
                                ip=f"{naming.frontend_root_address(slot)}/24")
            self.addLink(root, fe, intfName1=f"{naming.root_node(prefix)}-eth0")
            for rail in range(spec.num_rails):
                self.addSwitch(naming.rail_bridge(prefix, rail), dpid=naming.dpid(prefix, rail),
                               **rail_opts)
            for rail in spec.shadow_ids:  # no hosts: veth ports (emulator.shadowports)
                self.addSwitch(naming.shadow_bridge(prefix, rail),
                               dpid=naming.dpid(prefix, rail), **rail_opts)
            for rank in range(spec.num_ranks):
                host = self.addHost(naming.host_name(prefix, rank),
                                    ip=f"{naming.frontend_address(slot, rank)}/24")
                self.addLink(host, fe, intfName1=naming.frontend_intf(prefix, rank),
                             addr1=naming.frontend_mac(rank))
                for rp in spec.rank_ports(rank):
                    bridge = naming.rail_bridge(prefix, rp.rail)
                    self.addLink(host, bridge, port2=rp.port,
                                 intfName1=naming.rail_intf(prefix, rank, rp.port_index),
                                 intfName2=naming.bridge_port_intf(prefix, rp.rail, rp.port),
                                 addr1=naming.rail_mac(rank, rp.port_index))
            for spare in spec.spares:
                j = spare.index
                host = self.addHost(naming.spare_name(prefix, j), ip=(
                    f"{naming.frontend_address(slot, spec.num_ranks + j)}/24"))
                self.addLink(host, fe, intfName1=naming.spare_frontend_intf(prefix, j),
                             addr1=naming.spare_frontend_mac(j))
                for k, port in enumerate(spare.ports):
                    self.addLink(host, naming.rail_bridge(prefix, spare.rail), port2=port,
                                 intfName1=naming.spare_rail_intf(prefix, j, k),
                                 intfName2=naming.bridge_port_intf(prefix, spare.rail, port),
                                 addr1=naming.spare_rail_mac(j, k))

    return PhotonicRailTopo()
