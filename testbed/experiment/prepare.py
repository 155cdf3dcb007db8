"""Everything a run needs before anything starts: schedule, replay plan, link rate, byte scale.

Both backends start from a :class:`Prepared` run: :func:`prepare` generates the schedule
(:mod:`workloads`), refuses what this machine cannot host (emulation only), picks the emulated
link rate and lowers the schedule to per-rank replay plans (:mod:`testbed.plan.replay`). Under
rail-state semantics it also sets the plan's request points (:mod:`testbed.plan.requestpoints`)
and the ports per rank the data rails' union of circuits needs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from controller.job import JobError
from controller.railstate import RAIL_STATE, bit_op_of, union_degree
from testbed.errors import RunRefused
from testbed.experiment.config import ExperimentConfig
from testbed.metrics.fidelity import calibrated_link_mbps, capacity_problem
from testbed.plan.replay import PlanError, ReplayPlan, build_plan
from testbed.plan.requestpoints import with_request_points
from workloads import generate_schedule
from workloads.schedule import Schedule
from workloads.timing import TimingModel, simulate


@dataclass
class Prepared:
    """What a run needs before anything starts: schedule, plan, link rate and scale."""

    config: ExperimentConfig
    schedule: Schedule
    plan: ReplayPlan
    link_mbps: float
    scale: float
    modeled_iteration_s: float
    ports_per_rank: int = 0  # K of the run (0: the config's effective_ports_per_rank)

    def __post_init__(self) -> None:
        if not self.ports_per_rank:
            self.ports_per_rank = self.config.effective_ports_per_rank


def prepare(cfg: ExperimentConfig, *, check_capacity: bool = True) -> Prepared:
    """Schedule and plan the run; raises :class:`RunRefused` for what this machine can't host."""
    schedule = generate_schedule(cfg.workload)
    world = schedule.world_size
    if check_capacity:
        problem = capacity_problem(world)
        if problem is not None:
            raise RunRefused(f"{cfg.source}: cannot emulate this cluster here: "
                             f"{problem.message}")
    link_mbps = cfg.link_mbps or calibrated_link_mbps(world)
    scale = link_mbps * 1e6 / (cfg.rail_gbps * 1e9)
    if scale > 1:
        raise RunRefused(f"{cfg.source}: network.link_mbps ({link_mbps}) is above the modelled "
                         f"rail rate ({cfg.rail_gbps} Gbit/s)")
    try:
        plan = build_plan(schedule, scale=scale, rail_gbps=cfg.rail_gbps,
                          latency_s=cfg.latency_us * 1e-6)
        ports = cfg.effective_ports_per_rank
        if cfg.effective_semantics == RAIL_STATE:  # port-exact: every call asks (the default)
            plan, ports = _rail_state_plan(cfg, schedule, plan)
    except PlanError as exc:
        raise RunRefused(f"{cfg.source}: {exc}") from exc
    times = simulate(schedule, TimingModel(rail_gbps=cfg.rail_gbps,
                                           latency_s=cfg.latency_us * 1e-6))
    modeled = max(e for _, e in times.values()) if times else 0.0
    return Prepared(cfg, schedule, plan, link_mbps, scale, modeled, ports)


#: Ports per rank the emulator and the drivers support (a NIC split in 1, 2 or 4).
PORT_SPLITS = (1, 2, 4)


def _rail_state_plan(cfg: ExperimentConfig, schedule: Schedule, plan: ReplayPlan
                     ) -> tuple[ReplayPlan, int]:
    """The plan with the rail-state request points, and K for the data rails' union."""
    try:
        for grp in plan.groups.values():
            bit_op_of(grp, plan.stages)
    except JobError as exc:
        raise RunRefused(f"{cfg.source}: ocs.semantics: rail-state cannot run this "
                         f"parallelism: {exc}") from exc
    rail_of = {r: schedule.rail_of(r) for r in range(schedule.world_size)}
    degree = union_degree(plan.groups.values(), rail_of)
    ports = next((k for k in PORT_SPLITS if k >= degree), None)
    if ports is None:
        raise RunRefused(f"{cfg.source}: ocs.semantics: rail-state lights every group's circuits "
                         f"at once, which needs {degree} ports per rank on its rail (at most "
                         f"{PORT_SPLITS[-1]})")
    points = with_request_points(plan, cfg.effective_request_points,
                                 predict=cfg.mode == "provisioning")
    return points, ports


def default_out_dir(cfg: ExperimentConfig, root: Path = Path("results")) -> Path:
    """``results/<name>-<mode>[-<delay>ms]-<timestamp>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    delay = "" if cfg.mode == "baseline" else f"-{cfg.switching_delay_ms:g}ms"
    return root / f"{cfg.name}-{cfg.mode}{delay}-{stamp}"
