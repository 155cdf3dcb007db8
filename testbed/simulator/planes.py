"""The sim backend's data path under a rival control plane (``controller.plane: static|rotor``).

:class:`PlaneSimulation` is the event engine (:class:`~testbed.simulator.engine.PlanSimulation`)
with the Opus controller out of the data path: its core runs as for the electrical baseline
(every call acknowledged at once, no reconfiguration), and the plane decides where each transfer
goes. It overrides only how a flow is placed on ports, rated and finished:

* a transfer from rank ``a`` to rank ``b`` (servers ``s``, ``t``) takes a **path** of circuits:
  a direct one when the plane has one, else through relay GPUs. A relayed flow occupies every
  port of its path at once (the relay forwards as the bytes arrive), so it costs bandwidth on
  **both** links: its rate is the payload rate over the flow count of its busiest port, and each
  hop adds the per-hop latency;
* **static** (:mod:`controller.planes.static`): the topology is installed before the job and
  never changes (no dark time). Under ``controller.relay_paths: fixed`` (the default) every
  transfer takes the fixed path of its comm group and rank pair
  (:func:`controller.planes.relay.path_table`, :mod:`testbed.plan.planes`), the one the
  emulator's rank processes forward along; under ``dynamic`` a transfer takes, when it starts,
  the least-loaded hop on a shortest path given every flow in flight
  (:func:`controller.planes.relay.route`): an upper bound on per-flow load balancing, which
  the emulator cannot run;
* **rotor** (:mod:`controller.planes.rotor`): at every slot start all circuits go dark for the
  switching delay: every transfer in progress pauses (its bits so far are kept) and resumes when
  the slot lights, on a direct circuit of the new slot or one relay hop, whichever has the
  less loaded busiest hop (RotorLB: direct by default, two hops over spare capacity,
  :func:`controller.planes.relay.rotor_route`); a transfer with neither waits for a later
  slot. A transfer thus spans slots. The rotor's clock runs whatever the traffic; the engine
  only processes its slots while transfers are open.

Checks: :mod:`testbed.simulator.planecheck`. Figures beside the run's summary:
:meth:`PlaneSimulation.plane_summary`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from controller.job import JobSpec
from controller.planes import ROTOR, STATIC, Matching, Switch, check_plane, switches
from controller.planes.relay import (
    Adjacency,
    Hop,
    adjacency,
    distances_to,
    rotor_route,
    route,
)
from controller.planes.rotor import RotorSchedule
from testbed.experiment.sections import DYNAMIC
from testbed.plan.planes import StaticPlan, server_demand, static_plan
from testbed.plan.replay import PlanOp
from testbed.simulator.engine import PlanSimulation, Record, SimulationError
from testbed.simulator.invariants import InvariantViolation
from testbed.simulator.network import NetworkModel
from testbed.simulator.planecheck import PlaneInvariants
from testbed.simulator.state import Flow, Port

if TYPE_CHECKING:
    from testbed.experiment.config import RunSettings

__all__ = ["PlaneSimulation", "server_demand"]  # server_demand's home: testbed.plan.planes


class PlaneSimulation(PlanSimulation):
    """A run under the ``static`` or ``rotor`` plane (see the module docstring)."""

    def __init__(self, programs: Mapping[int, Sequence[PlanOp]], job: JobSpec,
                 settings: RunSettings, *, network: NetworkModel, gpus_per_server: int,
                 seed: int = 0) -> None:
        plane = check_plane(settings.control_plane)
        if not settings.rival_plane:
            raise ValueError(f"PlaneSimulation runs the rival planes (static, rotor) outside "
                             f"mode baseline, not {plane!r} in mode {settings.mode!r}")
        delay_s = settings.switching_delay_ms / 1e3
        # the Opus core as for the electrical baseline: every call acknowledged at once
        super().__init__(programs, job, dataclasses.replace(settings, mode="baseline"),
                         network=network, gpus_per_server=gpus_per_server, seed=seed)
        self.plane = plane
        self.delay_s = delay_s
        g = gpus_per_server
        self.servers = max(job.ranks) // g + 1
        k = len(next(iter(job.ranks.values())).ports)
        self.switch_list = switches(g, k)
        self.checks = PlaneInvariants(job, g)
        self._ports: dict[Flow, list[Port]] = {}  # open pieces: the ports they occupy
        self._hops: dict[Flow, int] = {}  # open pieces: hop count
        self._sharing: dict[Flow, int] = {}  # open pieces: flows on their busiest port
        self.bits_by_sharing: dict[int, float] = {}  # bits carried, by that flow count
        self._sent: dict[Flow, float] = {}  # transfers not finished: bits carried so far
        self._parked: dict[Flow, float] = {}  # transfers waiting for a circuit: since when
        self.relay_paths = settings.relay_paths  # static: "fixed" or "dynamic"
        self._dist: dict[int, dict[int, int]] = {}  # dynamic static paths: t -> distances
        self.stats: dict[str, float] = {"relayed_bytes": 0.0, "direct_bytes": 0.0,
                                        "wait_s": 0.0, "slots": 0, "pieces": 0}
        self.rotor: RotorSchedule | None = None
        self._circuits_lit = True
        self._ticking = False
        self._slot = -1
        self.static: StaticPlan | None = None
        if plane == STATIC:
            try:
                self.static = static_plan(programs, g, k, self.servers)
            except ValueError as exc:
                raise SimulationError(str(exc)) from exc
            self.checks.configuration(self.static.topology, "the static topology")
            self._install(self.static.topology, 0)
        else:
            self.rotor = RotorSchedule.build(self.servers, self.switch_list, delay_s,
                                             settings.effective_rotor_slot_ms / 1e3)
            for i in range(self.rotor.period_slots):
                self.checks.configuration(self.rotor.config(i), f"rotor slot {i}")
            self._config: Mapping[Switch, Matching] = {}
            self._adj: Adjacency = {}
            self._config_id = -1

    # ------------------------------------------------------------ configurations

    def _install(self, config: Mapping[Switch, Matching], config_id: int) -> None:
        self._config = config
        self._adj = adjacency(config)
        self._config_id = config_id

    def _port(self, ports: dict[tuple[int, int], Port], server: int, sw: Switch) -> Port:
        """``server``'s port on switch ``sw`` (rail, port index) in ``ports``, made on first use."""
        key = (server * self.gpus + sw[0], sw[1])
        p = ports.get(key)
        if p is None:
            p = ports[key] = Port()
        return p

    def _egress(self, server: int, sw: Switch) -> Port:
        return self._port(self.egress, server, sw)

    def _ingress(self, server: int, sw: Switch) -> Port:
        return self._port(self.ingress, server, sw)

    def _load(self, sw: Switch, u: int, v: int) -> int:
        return max(len(self._egress(u, sw).flows), len(self._ingress(v, sw).flows))

    def _path(self, flow: Flow) -> list[Hop] | None:
        a, b = flow.call.rank.rank, flow.peer
        s, t = a // self.gpus, b // self.gpus
        if not self._circuits_lit:
            return None
        if self.plane == ROTOR:
            return rotor_route(self._adj, s, t, self._load)
        assert self.static is not None
        if self.relay_paths == DYNAMIC:  # the least-loaded shortest path now
            dist = self._dist.get(t)
            if dist is None:
                dist = self._dist[t] = distances_to(self._adj, t)
            return route(self._adj, s, t, self._load, dist=dist)
        return self.static.paths[(flow.call.op.collective_id, a, b)]  # the emulator's too

    # ------------------------------------------------------------- rotor clock

    def _rotor_config(self, slot: int) -> None:
        assert self.rotor is not None
        cfg_id = slot % self.rotor.period_slots
        config = self.rotor.config(cfg_id)
        self.checks.slot(self.rotor, slot, config, self.now)
        self._install(config, cfg_id)
        self._slot = slot
        self.stats["slots"] += 1

    def _start_clock(self) -> None:
        """The first transfer after an idle spell: the rotor's state at this instant."""
        rotor = self.rotor
        assert rotor is not None
        self._ticking = True
        slot = max(rotor.slot_at(self.now), self._slot + 1)
        self._rotor_config(slot)
        if self.now < rotor.light_s(slot):
            self._circuits_lit = False
            self._at(rotor.light_s(slot), self._light, slot)
        else:
            self._circuits_lit = True
            self._at(max(self.now, rotor.start_s(slot + 1)), self._dark, slot + 1)

    def _dark(self, slot: int) -> None:
        """Slot ``slot`` starts: every circuit goes dark; open transfers pause."""
        assert self.rotor is not None
        self._circuits_lit = False
        for flow, ports in self._ports.items():
            self._account(flow)
            flow.token += 1  # its scheduled end no longer holds
            for p in ports:
                p.flows.clear()
            self._parked[flow] = self.now
        self._ports.clear()
        self._hops.clear()
        self._sharing.clear()
        if not self._parked:
            self._ticking = False  # idle: the clock is read again at the next transfer
            return
        self._rotor_config(slot)
        self._at(max(self.now, self.rotor.light_s(slot)), self._light, slot)

    def _light(self, slot: int) -> None:
        """Slot ``slot``'s circuits light: waiting transfers take them if they can."""
        assert self.rotor is not None
        self._circuits_lit = True
        parked = self._parked
        self._parked = {}
        placed: list[Port] = []
        for flow, since in parked.items():
            path = self._path(flow)
            if path is None:
                self._parked[flow] = since
            else:
                self.stats["wait_s"] += self.now - since
                placed.extend(self._place(flow, path, rerate=False))
        self._rerate_ports(list(dict.fromkeys(placed)))
        self._at(max(self.now, self.rotor.start_s(slot + 1)), self._dark, slot + 1)

    # ---------------------------------------------------------------- the flows

    def _flow_start(self, flow: Flow) -> None:
        if flow not in self._sent:
            self._sent[flow] = 0.0
            self.checks.scheduled_bytes += flow.n
        if self.rotor is not None and not self._ticking:
            self._start_clock()
        path = self._path(flow)
        if path is None:
            self._parked[flow] = self.now
            return
        self._place(flow, path)

    def _place(self, flow: Flow, path: list[Hop], rerate: bool = True) -> list[Port]:
        """Put ``flow``'s next piece on ``path``'s ports; returns them (rated unless not
        ``rerate``: the caller rates a batch at once)."""
        a, b = flow.call.rank.rank, flow.peer
        self.checks.hops(self._config, path, self._circuits_lit, self.now, a, b)
        ports: list[Port] = []
        for sw, u, v in path:
            ports.append(self._egress(u, sw))
            ports.append(self._ingress(v, sw))
        self._ports[flow] = ports
        self._hops[flow] = len(path)
        flow.src, flow.dst = ports[0], ports[-1]
        flow.t_last = self.now
        self._flows += 1
        self.stats["pieces"] += 1
        for p in ports:
            p.flows.append(flow)
        if rerate:
            self._rerate_ports(ports)
        return ports

    def _account(self, f: Flow) -> None:
        """Bits ``f`` carried since its last rate change."""
        bits = min(f.bits, f.rate * (self.now - f.t_last))
        f.bits -= bits
        f.t_last = self.now
        self._sent[f] += bits
        n = self._sharing.get(f, 1)
        self.bits_by_sharing[n] = self.bits_by_sharing.get(n, 0.0) + bits
        self.stats["relayed_bytes" if self._hops[f] > 1 else "direct_bytes"] += bits / 8

    def _rerate_ports(self, ports: Sequence[Port]) -> None:
        seen: dict[Flow, None] = {}
        for p in ports:
            for f in p.flows:
                seen[f] = None
        for f in seen:
            self._account(f)
            self._rate(f)

    def _rate(self, flow: Flow) -> None:
        n = self._sharing[flow] = max(len(p.flows) for p in self._ports[flow])
        flow.rate = self._payload_bps / n
        flow.token += 1
        self._at(self.now + flow.bits / flow.rate, self._flow_sent, flow, flow.token)

    def _unplace(self, flow: Flow) -> list[Port]:
        """Take ``flow``'s open piece off its ports (its bits so far accounted); returns them."""
        self._account(flow)
        ports = self._ports.pop(flow)
        self._hops.pop(flow)
        self._sharing.pop(flow, None)
        flow.token += 1  # its scheduled end no longer holds
        for p in ports:
            p.flows.remove(flow)
        self._rerate_ports(ports)
        return ports

    def _flow_sent(self, flow: Flow, token: int) -> None:
        if token != flow.token:
            return  # superseded by a rate change or a pause
        hops = self._hops[flow]
        self._unplace(flow)
        a = flow.call.rank.rank
        self.checks.transfer_done(a, flow.peer, flow.n, self._sent.pop(flow), flow.rate,
                                  self.now)
        conn = flow.conn
        if conn.queue:
            self._flow_start(conn.queue.pop(0))
        else:
            conn.busy = False
        self._at(self.now + self._latency_s * hops, self._arrive, flow)

    def _arrive(self, flow: Flow) -> None:
        self.checks.delivered_bytes += flow.n
        super()._arrive(flow)

    def run(self) -> tuple[list[Record], list[dict[str, Any]]]:
        records, events = super().run()
        try:
            self.checks.finish()
        except InvariantViolation as exc:
            raise SimulationError(f"invariant violated: {exc}") from exc
        return records, events

    def plane_summary(self) -> dict[str, Any]:
        """The plane's figures for the run's summary (``plane`` and ``plane_stats``)."""
        total = self.stats["relayed_bytes"] + self.stats["direct_bytes"]
        bits = sum(self.bits_by_sharing.values())
        out: dict[str, Any] = {
            "plane": self.plane, "switches": len(self.switch_list),
            "relayed_share": self.stats["relayed_bytes"] / total if total else 0.0,
            "bytes_scheduled": self.checks.scheduled_bytes,
            "bytes_delivered": self.checks.delivered_bytes,
            "pieces": int(self.stats["pieces"]),
            # the share of the bits carried while their path's busiest port held n flows
            # (n = 1: alone; the rate is the line rate / n), warm-up included
            "bits_by_flows_on_port": {str(n): b / bits for n, b in
                                      sorted(self.bits_by_sharing.items())} if bits else {}}
        if self.rotor is not None:
            out.update(slot_ms=self.rotor.slot_s * 1e3, delay_ms=self.delay_s * 1e3,
                       matchings=len(self.rotor.cycle), period_slots=self.rotor.period_slots,
                       slots_processed=int(self.stats["slots"]),
                       wait_s=self.stats["wait_s"])
        else:
            out["relay_paths"] = self.relay_paths
            out["topology"] = {f"rail{sw[0]}.port{sw[1]}": sorted(
                [s, t] for s, t in m.items() if s < t) for sw, m in self._config.items()}
        return out
