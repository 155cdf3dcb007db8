"""The rail settings an imported schedule needs, so that the experiment written for it runs.

A trace's comm groups are whatever the job used: an all-to-all on 8 ranks of one rail, a ring
of 3 or more. On optical rails each rank has K ports per rail (``ocs.ports_per_rank``) and a
collective's circuits must fit them. :func:`fit_rails` chooses, per collective kind and axis of
the schedule, the fewest ports the rings need (:data:`MAX_PORTS_PER_RANK` at most) and, where
the kind's default algorithm needs more (an all-to-all's pairwise exchange needs its group's
full mesh, ``n - 1`` ports), the algorithm that fits (:data:`FALLBACKS`: ``multihop``, the
photonic-rails paper's forwarding over the ring, §5). Each choice comes with a note saying why.

The choices are then put to the job check every run makes before it starts (the replay plan's
:meth:`~testbed.plan.replay.ReplayPlan.job`, i.e. :class:`controller.job.JobSpec`), so an
import is refused, naming the group, only for what no setting can carry (traffic across rails,
for one); nothing else is refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from controller.job import JobError, rail_job_ports
from testbed.plan.replay import PlanError, build_plan
from workloads.algorithms import ALGORITHM
from workloads.captured import CaptureError
from workloads.schedule import Schedule
from workloads.steps import P2P_KINDS

#: The most ports per rank and rail an import asks for: the two circuits of a ring (K = 2, as
#: degree-aware assignment uses). More would fit a pairwise all-to-all, but is rarely built.
MAX_PORTS_PER_RANK = 2
#: Per kind, the algorithms to try, in order, when its default needs more ports than that.
FALLBACKS = {"all_to_all": ("multihop", "matchings")}


class RailFitError(CaptureError):
    """An imported schedule that no ports-per-rank or algorithm setting can run on the rails;
    the message names the group."""


@dataclass(frozen=True)
class RailFit:
    """What :func:`fit_rails` chose: the schedule (its config with the chosen algorithms), the
    ports per rank and one note per choice, saying why."""

    schedule: Schedule
    ports_per_rank: int
    notes: tuple[str, ...]


def _members_on_a_rail(schedule: Schedule, axis: str) -> int:
    """The most members one group of ``axis`` has on one rail (its ring's or mesh's size
    there), over the groups whose traffic leaves the server."""
    most = 0
    scale_up = schedule.group_scale_up(axis)
    for g, members in enumerate(schedule.groups[axis].ranks.tolist()):
        if bool(scale_up[g]):
            continue
        per_rail: dict[int, int] = {}
        for r in members:
            per_rail[schedule.rail_of(r)] = per_rail.get(schedule.rail_of(r), 0) + 1
        most = max(most, *per_rail.values())
    return most


def fit_rails(schedule: Schedule) -> RailFit:
    """The ports per rank and algorithms ``schedule`` needs on optical rails (see the module
    docstring); :class:`RailFitError` naming the group when no setting carries it."""
    cfg = schedule.config
    network = sorted({(t.kind, t.axis) for p in schedule.programs for t in p.ops
                      if t.is_collective and t.axis and t.kind not in P2P_KINDS})
    chosen: list[tuple[str, str, str]] = []
    notes: list[str] = []
    needs: list[tuple[int, str]] = []  # (ports, why) of each kind and axis needing more than 1
    for kind, axis in network:
        n = _members_on_a_rail(schedule, axis)
        name = cfg.algorithm_for(kind, axis)
        algorithm = ALGORITHM[name]
        need = algorithm.min_ports(kind, n)
        fits = [a for a in FALLBACKS.get(kind, ())
                if ALGORITHM[a].min_ports(kind, n) <= MAX_PORTS_PER_RANK]
        if need > MAX_PORTS_PER_RANK and fits:
            pick = ALGORITHM[fits[0]]
            chosen.append((kind, axis, pick.name))
            notes.append(
                f"{kind} on the {axis} groups ({n} ranks on a rail) runs {pick.name} (set in "
                f"workload.json's algorithms): {name}, the default, needs {need} ports per "
                f"rank ({algorithm.port_reason}), more than the {MAX_PORTS_PER_RANK} an "
                f"import gives a rank; {pick.name} needs {pick.min_ports(kind, n)} "
                f"({pick.port_reason}). To keep {name}, remove it from workload.json's "
                f"algorithms and set ocs.ports_per_rank: {need}")
            name, algorithm, need = pick.name, pick, pick.min_ports(kind, n)
        if need > 1:  # (above MAX_PORTS_PER_RANK only where no algorithm of the kind fits)
            needs.append((need, f"{kind} on the {axis} groups ({n} ranks on a rail) runs "
                                f"{name}: {algorithm.port_reason}"))
    ports = max((k for k, _ in needs), default=1)
    if ports > 1:
        notes.insert(0, f"ocs.ports_per_rank: {ports}: "
                     + "; ".join(why for k, why in needs if k == ports))
    if chosen:
        keep = tuple(a for a in cfg.algorithms if (a[0], a[1]) not in
                     {(k, ax) for k, ax, _ in chosen})
        config = dataclasses.replace(cfg, algorithms=keep + tuple(chosen))
        schedule = dataclasses.replace(schedule, config=config, _index={}, _scale_up={},
                                       _lowered={})
    check_job(schedule, ports)
    return RailFit(schedule, ports, tuple(notes))


def check_job(schedule: Schedule, ports_per_rank: int) -> None:
    """The job check a run makes before it starts (its plan at ``ports_per_rank`` on optical
    rails, registered as a :class:`controller.job.JobSpec`); :class:`RailFitError` with its
    reason, naming the group, when it fails."""
    world = schedule.world_size
    try:
        plan = build_plan(schedule, scale=1.0, ports_per_rank=ports_per_rank)
        plan.job("import", rail_job_ports(range(world), schedule.cluster.gpus_per_server,
                                          ports_per_rank))
    except PlanError as exc:
        # (a JobError's own words: the plan's advice to add ports was already followed)
        why = exc.__cause__ if isinstance(exc.__cause__, JobError) else exc
        raise RailFitError(f"no ports-per-rank or algorithm setting runs this trace on the "
                           f"rails: {why} (--gpus-per-server sets which rail each rank is "
                           "on); nothing was written") from exc
