"""What a rival control plane needs from a replay plan, the same on both backends (issue 40).

The static plane (:mod:`controller.planes.static`) chooses its circuits from the job's bytes per
server pair (:func:`server_demand`) and fixes one path per pair of ranks
(:func:`controller.planes.relay.path_table`, on :func:`rank_demand`): the sim places each
transfer on it (:mod:`testbed.simulator.planes`), the emulator's rank processes forward along it
(:mod:`testbed.emulated.relay`). :func:`static_plan` builds both; :func:`relay_bytes` says how
many bytes each rank forwards for others per iteration, which an emulated run checks against
what its relays counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.planes import Matching, Switch, switches
from controller.planes.relay import Hop, Pair, TransferKey, path_table, stations
from controller.planes.static import static_topology, unreachable
from testbed.plan.replay import PlanOp


def rank_demand(programs: Mapping[int, Sequence[PlanOp]]) -> dict[Pair, float]:
    """Bytes per iteration from each rank to each other (ordered pairs), over every call's
    sends."""
    out: dict[Pair, float] = {}
    for a, ops in programs.items():
        for op in ops:
            if not op.is_call:
                continue
            for step in op.steps:
                for b, n in step.sends:
                    out[(a, b)] = out.get((a, b), 0.0) + n
    return out


def call_demand(programs: Mapping[int, Sequence[PlanOp]]) -> dict[str, dict[Pair, float]]:
    """:func:`rank_demand` per collective (its id): the transfers that run together."""
    out: dict[str, dict[Pair, float]] = {}
    for a, ops in programs.items():
        for op in ops:
            if not op.is_call:
                continue
            per = out.setdefault(op.collective_id, {})
            for step in op.steps:
                for b, n in step.sends:
                    per[(a, b)] = per.get((a, b), 0.0) + n
    return out


def server_demand(programs: Mapping[int, Sequence[PlanOp]], gpus_per_server: int
                  ) -> dict[tuple[int, int], float]:
    """Bytes per iteration between servers (unordered pairs), over every rank's sends."""
    out: dict[tuple[int, int], float] = {}
    for (a, b), n in rank_demand(programs).items():
        s, t = a // gpus_per_server, b // gpus_per_server
        if s != t:
            key = (min(s, t), max(s, t))
            out[key] = out.get(key, 0.0) + n
    return out


#: (collective id, sending rank, receiving rank)
CallPair = tuple[str, int, int]


@dataclass(frozen=True)
class StaticPlan:
    """The static plane of a job: its circuits (a matching of servers per switch) and the path
    of every transfer across servers, per collective and rank pair. Every collective of a comm
    group takes the group's path for the pair (:func:`path_table` on the bytes per group and
    rank pair): two groups of a pair may run at once (FSDP prefetches beside EP all-to-alls)
    and then take different circuits where the pair has several. (One path per rank pair,
    whatever the group, ran DeepSeek-EP K = 2 on the sim at 0.77 s a step against 0.73 s; the
    sim's ``relay_paths: dynamic``, 0.57 s: docs/validation.md 12.3.)"""

    servers: int
    gpus_per_server: int
    topology: dict[Switch, Matching]
    paths: dict[CallPair, list[Hop]]

    def stations(self, cid: str, a: int, b: int) -> list[int]:
        """The ranks a transfer of collective ``cid`` from ``a`` to ``b`` passes through (``a``
        and ``b`` included; ``[a, b]`` inside a server)."""
        if a // self.gpus_per_server == b // self.gpus_per_server:
            return [a, b]
        return stations(self.paths[(cid, a, b)], a, b, self.gpus_per_server)


def static_plan(programs: Mapping[int, Sequence[PlanOp]], gpus_per_server: int,
                ports_per_rank: int, servers: int) -> StaticPlan:
    """The static plane for ``programs`` (ValueError if a pair that talks has no path: too
    few ports)."""
    demand = server_demand(programs, gpus_per_server)
    topo = static_topology(demand, servers, switches(gpus_per_server, ports_per_rank))
    lost = unreachable(demand, topo, servers)
    if lost:
        raise ValueError(f"the static topology leaves server pairs {lost[:4]} without a path: "
                         "too few ports")
    demand_by_group: dict[TransferKey, float] = {}
    group_of: dict[str, str] = {}  # collective id -> its comm group (lane)
    for a, ops in programs.items():
        for op in ops:
            if not op.is_call:
                continue
            group_of[op.collective_id] = op.lane
            for step in op.steps:
                for b, n in step.sends:
                    demand_by_group[(op.lane, a, b)] = demand_by_group.get((op.lane, a, b),
                                                                           0.0) + n
    table = path_table(topo, demand_by_group, gpus_per_server)
    paths: dict[CallPair, list[Hop]] = {(cid, a, b): table[(group_of[cid], a, b)]
                                        for cid, per in call_demand(programs).items()
                                        for a, b in per if (group_of[cid], a, b) in table}
    return StaticPlan(servers, gpus_per_server, topo, paths)


def relay_bytes(programs: Mapping[int, Sequence[PlanOp]], plan: StaticPlan) -> dict[int, int]:
    """Bytes each rank forwards for others per iteration along ``plan``'s paths (ranks that
    forward nothing left out)."""
    out: dict[int, int] = {}
    for cid, per in call_demand(programs).items():
        for (a, b), n in per.items():
            for x in plan.stations(cid, a, b)[1:-1]:
                out[x] = out.get(x, 0) + int(n)
    return out


def relayed_share(programs: Mapping[int, Sequence[PlanOp]], plan: StaticPlan) -> float:
    """The share of the bytes between servers whose path has more than one circuit (the sim's
    ``relayed_share``)."""
    total = relayed = 0.0
    for cid, per in call_demand(programs).items():
        for (a, b), n in per.items():
            path = plan.paths.get((cid, a, b))
            if path is None:
                continue
            total += n
            if len(path) > 1:
                relayed += n
    return relayed / total if total else 0.0
