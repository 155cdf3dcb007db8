"""The static control plane on the emulated rails (issue 40): its circuits, its relays, its
checks.

The run (:func:`testbed.emulated.runner.run_emulated` with ``controller.plane: static``):

1. :func:`testbed.plan.planes.static_plan` picks the circuits and every rank pair's path, as on
   the sim backend;
2. :func:`install` puts the circuits on the OCS bridges once, before any rank starts, through
   the run's emulated OCS driver (so the OCS app checks one-to-one as for any request); with one
   port per rank the hosts' routes to their rail peers are fixed from the start
   (:class:`emulator.hostnet.HostRouter`);
3. the Opus core runs as for the electrical baseline (every call acknowledged at once, no
   reconfiguration), and each rank's plan carries its transfers' paths (:func:`rank_relays`):
   the rank processes forward the bytes along them (:mod:`testbed.emulated.relay`), over the
   circuits between servers and over Unix sockets (the scale-up domain) inside one;
4. :class:`StaticFollower` reads every rail bridge's flows (``ovs-ofctl dump-flows``, an
   observer the plane does not control) as the ranks start and once they finished, and
   :func:`plane_stats` checks them (one-to-one, unchanged) and the relays' counts against the
   plan: the ``plane_stats`` of the run's summary, as the sim's.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from controller.ocs import (
    ApplyResult,
    Circuit,
    OcsDriver,
    PortState,
    RailDescription,
    Reconfiguration,
)
from testbed.plan.planes import StaticPlan, rank_demand, relay_bytes, relayed_share
from testbed.plan.rankplan import Peer
from testbed.plan.replay import PlanOp

#: a circuit's flow on an OCS bridge (emulator/ocs_core.py: in_port alone, one output)
_CIRCUIT_FLOW = re.compile(r"in_port=\"?(\d+)\"?\s.*actions=output:\"?(\d+)\"?")


@dataclass(frozen=True)
class RankRelays:
    """A rank's part of the static plane: its transfers' stations (collective id -> peer ->
    the addresses after this rank), and the Unix socket it listens on for its server's GPUs."""

    routes: dict[str, dict[int, tuple[Peer, ...]]]
    scale_up: str

    def replay_fields(self) -> dict[str, Any]:
        """The :class:`~testbed.plan.rankplan.ReplayPart` fields it sets."""
        return {"routes": self.routes, "scale_up": self.scale_up}


def rank_relays(plan: StaticPlan, programs: Mapping[int, Sequence[PlanOp]],
                rail_address: Callable[[int], str], port: int, scale_up_dir: Path
                ) -> dict[int, RankRelays]:
    """Every rank's :class:`RankRelays`: a station in another server is reached at its rail
    address and ``port``, one in the same server at its Unix socket in ``scale_up_dir``.
    Transfers straight to their peer's rail address are left out (the default route)."""
    g = plan.gpus_per_server

    def unix(rank: int) -> str:
        return str(scale_up_dir / f"r{rank}.sock")

    out: dict[int, RankRelays] = {}
    for a, ops in programs.items():
        routes: dict[str, dict[int, tuple[Peer, ...]]] = {}
        for op in ops:
            if not op.is_call:
                continue
            for step in op.steps:
                for b, _n in step.sends:
                    st = plan.stations(op.collective_id, a, b)
                    if len(st) == 2:
                        continue
                    routes.setdefault(op.collective_id, {})[b] = tuple(
                        unix(y) if x // g == y // g else (rail_address(y), port)
                        for x, y in itertools.pairwise(st))
        out[a] = RankRelays(routes, unix(a))
    return out


def install_reconfigurations(plan: StaticPlan, rank_port: Callable[[int, int], int]
                             ) -> list[Reconfiguration]:
    """The static topology as one request per rail: switch (rail, k) joining servers ``s`` and
    ``t`` is a circuit between the rail's GPUs of ``s`` and ``t`` on their port ``k``
    (``rank_port(rank, k)``: the port number on the rail's bridge)."""
    g = plan.gpus_per_server
    per_rail: dict[int, list[tuple[int, int]]] = {}
    for (rail, k), m in sorted(plan.topology.items()):
        for s, t in sorted(m.items()):
            if s < t:
                per_rail.setdefault(rail, []).append((rank_port(s * g + rail, k),
                                                      rank_port(t * g + rail, k)))
    return [Reconfiguration.of(rail, add=pairs) for rail, pairs in sorted(per_rail.items())]


def circuit_problems(flows: Mapping[int, Sequence[str]]) -> list[str]:
    """What breaks one-to-one in the bridges' circuit flows (rail -> ``dump-flows`` lines): a
    port with two outputs, a port two others send to, a circuit one way only."""
    problems: list[str] = []
    for rail, lines in sorted(flows.items()):
        out: dict[int, int] = {}
        for line in lines:
            m = _CIRCUIT_FLOW.search(line)
            if m is None:
                continue
            a, b = int(m.group(1)), int(m.group(2))
            if a in out:
                problems.append(f"rail {rail}: port {a} has two circuits ({out[a]}, {b})")
            out[a] = b
        into: dict[int, int] = {}
        for a, b in out.items():
            if b in into:
                problems.append(f"rail {rail}: ports {into[b]} and {a} both send to {b}")
            into[b] = a
            if out.get(b) != a:
                problems.append(f"rail {rail}: circuit {a}->{b} has no way back")
    return problems


def circuit_count(flows: Mapping[int, Sequence[str]]) -> int:
    """Circuits (two flows each) on the bridges."""
    return sum(1 for lines in flows.values() for line in lines
               if _CIRCUIT_FLOW.search(line)) // 2


class _Follower(Protocol):
    @property
    def pids(self) -> list[int]: ...

    def launch(self) -> None: ...

    def follow(self) -> None: ...

    def close(self) -> None: ...


class StaticFollower:
    """A run's rank follower, with the rail bridges' flows read as the ranks start and once
    they finished (``dump_flows(rail)``, for ``rails`` rails)."""

    def __init__(self, inner: _Follower, dump_flows: Callable[[int], list[str]],
                 rails: int) -> None:
        self.inner = inner
        self._dump = dump_flows
        self.rails = rails
        self.before: dict[int, list[str]] = {}
        self.after: dict[int, list[str]] = {}

    @property
    def pids(self) -> list[int]:
        return self.inner.pids

    def _flows(self) -> dict[int, list[str]]:
        return {rail: self._dump(rail) for rail in range(self.rails)}

    def launch(self) -> None:
        self.before = self._flows()
        self.inner.launch()

    def follow(self) -> None:
        self.inner.follow()
        self.after = self._flows()

    def close(self) -> None:
        self.inner.close()


def plane_stats(plan: StaticPlan, programs: Mapping[int, Sequence[PlanOp]], iterations: int,
                records: Sequence[Mapping[str, Any]], circuits_installed: int,
                before: Mapping[int, Sequence[str]], after: Mapping[int, Sequence[str]]
                ) -> dict[str, Any]:
    """The static plane's figures and checks for an emulated run's summary (``plane_stats``):
    the sim's figures (relayed share, bytes scheduled and delivered, topology) beside the
    relays' own counts against the plan's, one-to-one on every bridge and no change during the
    run. ``problems`` lists every check that failed (empty: all held)."""
    g = plan.gpus_per_server
    scheduled = sum(n for (a, b), n in rank_demand(programs).items()
                    if a // g != b // g) * iterations
    delivered = sum(int(r.get("received") or 0) for r in records if r.get("ev") == "call"
                    and int(r.get("it", 0)) >= 0)
    expected = {r: n * iterations for r, n in relay_bytes(programs, plan).items()}
    counted: dict[int, int] = {}
    relay_errors: list[str] = []
    for r in records:
        if r.get("ev") == "finished" and "relay" in r:
            counted[int(r["rank"])] = int(r["relay"]["forwarded_bytes"])
            relay_errors += [f"rank {r['rank']}: {e}" for e in r["relay"].get("errors", ())]
    problems = [f"before the ranks: {p}" for p in circuit_problems(before)]
    problems += [f"after the ranks: {p}" for p in circuit_problems(after)]
    if dict(before) != dict(after):
        problems.append("the bridges' flows changed during the run")
    if circuit_count(before) != circuits_installed:
        problems.append(f"{circuit_count(before)} circuits on the bridges, "
                        f"{circuits_installed} installed")
    wrong = {r: (counted.get(r, 0), n) for r, n in expected.items() if counted.get(r, 0) != n}
    wrong.update({r: (n, 0) for r, n in counted.items() if n and r not in expected})
    problems += [f"rank {r} forwarded {got} bytes, the plan {want}"
                 for r, (got, want) in sorted(wrong.items())]
    problems += relay_errors
    return {
        "plane": "static", "switches": len(plan.topology),
        "relayed_share": relayed_share(programs, plan),
        "bytes_scheduled": scheduled, "bytes_received": delivered,
        "relay_forwarded_bytes": sum(counted.values()),
        "relay_forwarded_bytes_planned": sum(expected.values()),
        "relay_ranks": len(expected),
        "hops_max": max((len(p) for p in plan.paths.values()), default=0),
        "circuits": circuits_installed, "one_to_one": not circuit_problems(before)
        and not circuit_problems(after), "reconfigured_during_run": dict(before) != dict(after),
        "problems": problems,
        "topology": {f"rail{sw[0]}.port{sw[1]}": sorted([s, t] for s, t in m.items() if s < t)
                     for sw, m in plan.topology.items()}}


class HeldRailsDriver(OcsDriver):
    """The driver the Opus core gets under a rival plane: every rail described as a packet
    switch, so that the core acknowledges each call at once and switches nothing, as for the
    electrical baseline; the circuits are the plane's (installed through ``inner``), and a
    request to change them is refused."""

    def __init__(self, inner: OcsDriver) -> None:
        self.inner = inner

    def describe(self) -> list[RailDescription]:
        return [dataclasses.replace(r, mode="electrical") for r in self.inner.describe()]

    def circuits(self, rail: int) -> frozenset[Circuit]:
        return frozenset()

    def port_states(self, rail: int) -> dict[int, PortState]:
        return self.inner.port_states(rail)

    def apply_many(self, reconfs: Sequence[Reconfiguration]) -> list[ApplyResult]:
        if any(not r.is_empty for r in reconfs):
            raise RuntimeError("the static plane holds the rails: Opus switches nothing")
        return []
