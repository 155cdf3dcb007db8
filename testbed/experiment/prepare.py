"""Everything a run needs before anything starts: schedule, replay plan, link rate, byte scale.

Both backends start from a :class:`Prepared` run: :func:`prepare` generates the schedule
(:mod:`workloads`; compute calibrated to ``workload.calibrate_step_s`` if the experiment file
did not already do it) or loads it (``workload: {schedule: FILE}``), refuses what this machine
cannot host (emulation only), picks the emulated link rate and lowers the schedule to per-rank
replay plans (:mod:`testbed.plan.replay`). Under rail-state semantics it also sets the plan's
request points (:mod:`testbed.plan.requestpoints`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from controller.job import JobError, rail_job_ports
from controller.railstate import RAIL_STATE, bit_op_of
from testbed.errors import RunRefused
from testbed.experiment.config import (
    FABRIC,
    SIM_COSTS,
    ExperimentConfig,
    RunSettings,
    check_algorithm_ports,
)
from testbed.experiment.dilation import (
    AUTO,
    AUTO_FACTORS,
    Choice,
    DilationError,
    OverheadPrediction,
    choose,
    max_factor_for_link,
    plan_load,
    wall_link_mbps,
)
from testbed.metrics.fidelity import calibrated_link_mbps, capacity_problem, ranks_per_core_cap
from testbed.plan.replay import PlanError, ReplayPlan, build_plan
from testbed.plan.requestpoints import with_request_points
from workloads import WorkloadConfigError
from workloads.calibrate import calibrate, modeled_step_s
from workloads.schedule import Schedule


@dataclass
class Prepared:
    """What a run needs before anything starts: schedule, plan, link rate and scale."""

    config: ExperimentConfig
    schedule: Schedule
    plan: ReplayPlan
    link_mbps: float  # in model time; the emulated links run at link_mbps / time_dilation
    scale: float
    modeled_iteration_s: float  # on electrical rails (workloads.timing), calibrated if asked
    #: the cost model the plan is for: ``emulator`` (the emulator's scaled link; an emulated
    #: run's plan) or ``fabric`` (the modelled rail with the real bytes; sim backend only)
    costs: str = "emulator"
    dilation: Choice | None = None  # emulation: the time dilation and why (None: 1, the sim)

    @property
    def time_dilation(self) -> float:
        """``k``: every modelled time runs ``k`` times longer on the emulator's wall clock."""
        return 1.0 if self.dilation is None else self.dilation.k


def prepare(cfg: ExperimentConfig, *, check_capacity: bool = True,
            schedule: Schedule | None = None, verify: bool = False,
            costs: str = "emulator",
            predict_overhead: Callable[[ExperimentConfig], OverheadPrediction | None] | None
            = None) -> Prepared:
    """Schedule and plan the run; raises :class:`RunRefused` for what this machine can't host,
    :class:`~testbed.experiment.config.ExperimentError` for algorithms the ports can't carry.

    ``check_capacity`` (an emulated run) also picks the run's time dilation
    (:mod:`testbed.experiment.dilation`), which the capacity check takes into account.
    ``schedule`` replaces the experiment's (benchmarks of one collective:
    :mod:`workloads.micro`; never calibrated); ``verify`` plans carry real data (tests).
    ``costs`` is the cost model the plan is for (:data:`~testbed.experiment.sections.SIM_COSTS`):
    ``emulator`` plans at the emulator's link with bytes scaled by link / rail rate (what an
    emulated run replays), ``fabric`` at the modelled ``rail_gbps`` with the real bytes (a
    simulation of the datacenter; :func:`testbed.simulator.run.prepare_sim`).
    ``predict_overhead`` gives ``auto`` the overhead the run is predicted to carry and its
    switches (:func:`testbed.studies.predict.fabric_overhead`: this layer cannot run the
    simulator), so it bounds late light's share of the overhead.
    """
    if costs not in SIM_COSTS:
        raise ValueError(f"unknown cost model {costs!r}; choose from {', '.join(SIM_COSTS)}")
    if schedule is None:
        cfg, schedule = _calibrated_schedule(cfg)
    check_algorithm_ports(cfg, schedule)
    modeled = modeled_step_s(schedule, cfg.timing_model)
    world = schedule.world_size
    if costs == FABRIC:
        link_mbps, scale = cfg.rail_gbps * 1e3, 1.0
    else:
        link_mbps = cfg.link_mbps or calibrated_link_mbps(world)
        scale = link_mbps * 1e6 / (cfg.rail_gbps * 1e9)
    if scale > 1:
        raise RunRefused(f"{cfg.source}: network.link_mbps ({link_mbps}) is above the modelled "
                         f"rail rate ({cfg.rail_gbps} Gbit/s)")
    if check_capacity:  # before planning, at the largest factor the run may get
        _check_capacity(cfg, world, float(cfg.time_dilation) if cfg.time_dilation != AUTO
                        else min(AUTO_FACTORS[-1], max_factor_for_link(link_mbps)))
    plan = _plan(cfg, schedule, scale, verify)
    if not check_capacity:
        return Prepared(cfg, schedule, plan, link_mbps, scale, modeled, costs)
    overhead = (predict_overhead(cfg) if predict_overhead is not None
                and cfg.time_dilation == AUTO and cfg.mode != "baseline" else None)
    choice = choose_dilation(cfg, plan, modeled, link_mbps, overhead)
    _check_capacity(cfg, world, choice.k)
    return Prepared(cfg, schedule, plan, link_mbps, scale, modeled, costs, choice)


def _check_capacity(cfg: ExperimentConfig, world: int, k: float) -> None:
    """Refuse ranks (and spares) this machine cannot host at time dilation ``k``."""
    problem = capacity_problem(world, time_dilation=k)
    if problem is not None:
        raise RunRefused(f"{cfg.source}: cannot emulate this cluster here: "
                         f"{problem.message}")
    spares = len(cfg.shape.spares)
    problem = capacity_problem(world + spares, time_dilation=k) if spares else None
    if problem is not None:
        raise RunRefused(f"{cfg.spares_position or cfg.source}: cluster.spares_per_server/"
                         f"spare_servers: {spares} spares (each a standby rank process) do "
                         f"not fit beside {world} ranks: {problem.message}; use fewer "
                         "spares")


def choose_dilation(cfg: ExperimentConfig, plan: ReplayPlan, modeled_iteration_s: float,
                    link_mbps: float, overhead: OverheadPrediction | None = None) -> Choice:
    """The run's time dilation: the configured factor, or ``auto``'s pick from the plan's load
    (:func:`testbed.experiment.dilation.choose`), never past what the links can be slowed to;
    a factor the links cannot take is refused."""
    cluster = cfg.workload.cluster
    cores = os.cpu_count() or 1
    load = plan_load(plan.programs, modeled_iteration_s, cfg.switching_delay_ms,
                     gpus_per_server=cluster.gpus_per_server,
                     ports_per_rail=cluster.servers * cfg.effective_ports_per_rank,
                     cores=cores,
                     ports_per_rank=cfg.effective_ports_per_rank)
    if cfg.mode == "baseline" or cfg.control_plane == "static":
        # packet switches, or the static plane's circuits set before the ranks start: no
        # light to wait for during the run
        load = dataclasses.replace(load, switches=0.0, exposed_s=0.0)
    elif overhead is not None:
        load = dataclasses.replace(load, overhead=overhead)
    ranks = len(plan.programs) + len(cfg.shape.spares)
    try:
        if cfg.time_dilation != AUTO:
            wall_link_mbps(link_mbps, float(cfg.time_dilation))
        return choose(cfg.time_dilation, load,
                      max_k=min(AUTO_FACTORS[-1], max_factor_for_link(link_mbps)),
                      min_k=ranks / (ranks_per_core_cap(1.0) * cores))
    except DilationError as exc:
        raise RunRefused(f"{cfg.source}: run.time_dilation: {exc}") from exc


def _plan(cfg: ExperimentConfig, schedule: Schedule, scale: float, verify: bool
          ) -> ReplayPlan:
    """The replay plan of ``schedule`` (with rail-state's request points)."""
    world = schedule.world_size
    try:
        plan = build_plan(schedule, scale=scale, rail_gbps=cfg.rail_gbps,
                          latency_s=cfg.latency_us * 1e-6,
                          ports_per_rank=cfg.effective_ports_per_rank,
                          electrical=cfg.packet_switched, verify=verify)
        plan.job("check", rail_job_ports(range(world), schedule.cluster.gpus_per_server,
                                         cfg.effective_ports_per_rank))
        if cfg.effective_semantics == RAIL_STATE:  # port-exact: every call asks (the default)
            plan = _rail_state_plan(cfg, plan)
    except PlanError as exc:
        raise RunRefused(f"{cfg.source}: {exc}") from exc
    return plan


def _calibrated_schedule(cfg: ExperimentConfig) -> tuple[ExperimentConfig, Schedule]:
    """The experiment's schedule, its compute calibrated to ``workload.calibrate_step_s`` if
    the experiment file did not already do it."""
    schedule = cfg.schedule()
    target = cfg.workload.calibrate_step_s
    if target is not None and abs(modeled_step_s(schedule, cfg.timing_model) - target) \
            > 1e-6 * target:
        try:
            workload = calibrate(cfg.workload, cfg.timing_model)
        except WorkloadConfigError as exc:
            raise RunRefused(f"{cfg.source}: {exc}") from exc
        cfg = dataclasses.replace(cfg, workload=workload)
        schedule = cfg.schedule()
    return cfg, schedule


def _rail_state_plan(cfg: ExperimentConfig, plan: ReplayPlan) -> ReplayPlan:
    """The plan with the rail-state request points; refuses groups the bit model cannot hold."""
    try:
        for grp in plan.groups.values():
            bit_op_of(grp, plan.stages)
    except JobError as exc:
        raise RunRefused(f"{cfg.source}: ocs.semantics: rail-state cannot run this "
                         f"parallelism: {exc}") from exc
    return with_request_points(plan, cfg.effective_request_points,
                               predict=cfg.mode == "provisioning")


def default_out_dir(cfg: RunSettings, root: Path = Path("results")) -> Path:
    """``results/<name>-<mode>[-<delay>ms]-<timestamp>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    delay = "" if cfg.mode == "baseline" else f"-{cfg.switching_delay_ms:g}ms"
    return root / f"{cfg.name}-{cfg.mode}{delay}-{stamp}"
