"""``opus-testbed bench sim``: the sim backend on Llama3.1-405B at 1024 and 16384 H100s.

Parallelism of the Llama 3 paper for that model: TP 8 inside a server (with SP), PP 16, no CP,
FSDP over the rest (8 at 1024 GPUs, 128 at 16384), 16 micro-batches of one 8192-token
sequence, 1F1B. Rails: one per local GPU (8), two ports per GPU and rail (a DP or PP ring needs
two circuits per GPU), 400 Gbit/s per GPU, 25 ms switching, provisioning. The cost model is
``fabric`` by default (:data:`testbed.simulator.network.FABRIC_COSTS`: the real bytes at
400 Gbit/s, the controller's decision time; ``--costs emulator``: the emulator's fixed costs at a
1000 Mbit/s scaled link). One warm-up iteration (the profiling one) and one measured iteration
run.

What is simulated. In the replay model rails are independent: scale-up (TP) collectives are
timed compute, every network group is rail-aligned and the controller plans each rail on its
own, so rail 0 alone gives the same times as all eight rails. At 1024 GPUs every rank of rail 0
(128) runs its own plan. At 16384 GPUs (2048 ranks per rail) the ranks of one pipeline chain
(one per stage, 16) run their plans and each stands for the 127 other ranks of its DP ring on
rail 0 (:class:`~testbed.simulator.engine.Mirror`): the controller still sees every intent and
completion of all 2048 ranks and switches all their circuits, but transfers are simulated for
the 16 only. ``--mirror off`` runs all 2048 ranks of rail 0; ``--rails N`` runs every rank of
rails ``0..N-1``. Mirroring is not exact (:data:`MIRROR_ERROR`, in the JSON of a mirrored run
as ``mirror_error``): it holds every replica of a stage in lockstep with its representative,
while in the full rail replicas whose requests reach the rail's OCS together are split across
consecutive switches (a rail takes one request at a time: :mod:`controller.batching`), so some
run a switching delay behind the others until a collective that joins them.
``ranks_simulated``, ``ranks_mirrored`` and ``rails_simulated`` say what ran;
``cpu_s`` is the process's CPU time, which a loaded machine does not stretch as it does
``wall_s``.

A figure it gave: at 1024 GPUs, on demand at 25 ms (``--gpus 1024 --mode on-demand``), the base
mode's rule to keep idle circuits of the same parallelism (:mod:`controller.portexact`) took the
rail reconfigurations per iteration from 2364 to 460 and the simulated iteration from 63.7 s to
22.2 s (14.6 s without switching), when it came in.

Plans come from the run's own planner (:class:`testbed.plan.replay.Planner`, :func:`plan_bench`),
which lowers each program's compute once and a ring collective one member at a time.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from controller.job import JobSpec, rail_job_ports
from testbed.experiment.config import ExperimentConfig
from testbed.metrics.compute import compute_metrics
from testbed.plan.replay import PlanError, Planner, ReplayPlan
from testbed.simulator.engine import Mirror, PlanSimulation
from testbed.simulator.gcpause import collector_paused
from testbed.simulator.network import FABRIC, costs_of, network_model
from workloads.builder import generate_schedule
from workloads.config import WorkloadConfig
from workloads.hardware import Cluster, get_gpu
from workloads.models import get_preset
from workloads.parallel import ParallelConfig
from workloads.schedule import Schedule
from workloads.timing import TimingModel, simulate

#: How far a mirrored run's iteration time was from the same run without mirrors (fabric
#: costs; docs/validation.md, section 10.3): an empirical bound, not a proven one.
MIRROR_ERROR: dict[str, Any] = {
    "mechanism": "mirrored replicas of a stage move in lockstep with their representative; in "
                 "the full rail, replicas whose requests reach the rail's OCS together are "
                 "split across consecutive switches (one request at a time per rail), so some "
                 "run a switching delay behind the others until a collective joins them",
    "measured_pct": {"2048 GPUs, provisioning, 1 ms": 0.09,
                     "2048 GPUs, provisioning, 25 ms": -2.21,
                     "2048 GPUs, provisioning, 100 ms": -0.24,
                     "2048 GPUs, on-demand, 25 ms": 0.73,
                     "4096 GPUs, provisioning, 25 ms": -2.48,
                     "16384 GPUs, provisioning, 25 ms": -2.14},
    "bound_pct": 3.0,
    "bound_basis": "the largest measured |mirrored / unmirrored - 1| (2.5 %), rounded up; "
                   "measured, not proven: check other sizes, modes and delays with --mirror off",
}
GPUS_PER_SERVER = 8
RAIL_GBPS = 400.0
LINK_MBPS = 1000.0  # the emulator's link under --costs emulator (bytes x 2.5e-6)


def bench_experiment(gpus: int, *, mode: str = "provisioning",
                     switching_delay_ms: float = 25.0) -> ExperimentConfig:
    """Llama3.1-405B on ``gpus`` H100s with the Llama 3 paper's TP8/PP16/FSDP split."""
    if gpus % (8 * 16) or gpus < 256:
        raise ValueError(f"gpus must be a multiple of 128 (TP 8 x PP 16) and >= 256, got {gpus}")
    workload = WorkloadConfig(
        model=get_preset("llama3.1-405b"), cluster=Cluster(gpus // GPUS_PER_SERVER,
                                                           GPUS_PER_SERVER),
        parallel=ParallelConfig(tp=8, sp=True, fsdp=gpus // 128, pp=16),
        seq_len=8192, micro_batch_size=1, num_microbatches=16, gpu=get_gpu("h100"), mfu=0.4)
    workload.validate()
    cfg = ExperimentConfig(workload=workload, name=f"llama3.1-405b-{gpus}", mode=mode,
                           switching_delay=switching_delay_ms, ports_per_rank=2,
                           rail_gbps=RAIL_GBPS, link_mbps=LINK_MBPS,
                           latency_us=5.0, iterations=1, warmup=1)
    cfg.validate()
    return cfg


# --------------------------------------------------------------------------- the plans

@dataclass
class BenchPlan:
    """What the bench simulates: the plans run, the ranks they stand for, the controller's job."""

    plan: ReplayPlan
    mirrors: dict[int, list[Mirror]]
    job: JobSpec
    controlled: list[int]  # every rank the controller sees: those of rails 0..rails-1


def plan_bench(cfg: ExperimentConfig, schedule: Schedule, *, mirror: bool,
               rails: int = 1, scale: float | None = None) -> BenchPlan:
    """The plans of every rank of rails ``0..rails-1``, or (``mirror``) of one pipeline chain
    of rail 0 standing for the other ranks of the rail (see the module docstring).

    One :class:`testbed.plan.replay.Planner` lowers the simulated ranks and names the mirrored
    ranks' lanes, so the plans are :func:`testbed.plan.replay.build_plan`'s. ``scale`` is the
    byte scale (default: ``network.link_mbps`` over the rail rate; 1: the real bytes).
    """
    if mirror and rails != 1:
        raise ValueError("mirrored runs simulate rail 0 only")
    if cfg.link_mbps is None:
        raise ValueError(f"{cfg.name}: the bench needs network.link_mbps (it sets the byte scale)")
    controlled = [r for r in range(schedule.world_size) if schedule.rail_of(r) < rails]
    per_stage = schedule.world_size // cfg.workload.parallel.pp
    simulated = ([s * per_stage for s in range(cfg.workload.parallel.pp)] if mirror
                 else controlled)
    if scale is None:
        scale = cfg.link_mbps * 1e6 / (cfg.rail_gbps * 1e9)
    planner = Planner(schedule, scale=scale,
                      rail_gbps=cfg.rail_gbps, latency_s=cfg.latency_us * 1e-6,
                      ports_per_rank=cfg.effective_ports_per_rank,
                      electrical=cfg.packet_switched)
    plan = planner.plan(simulated)
    mirrors: dict[int, list[Mirror]] = {}
    if mirror:
        chain = set(simulated)
        mirrors = _mirrors(schedule, planner, plan, [r for r in controlled if r not in chain])
    ports = rail_job_ports(controlled, cfg.workload.cluster.gpus_per_server,
                           cfg.effective_ports_per_rank)
    return BenchPlan(plan, mirrors, JobSpec("train", ports, planner.groups(),
                                            check_ports=not cfg.packet_switched), controlled)


def _mirrors(schedule: Schedule, planner: Planner, plan: ReplayPlan, mirrored: Iterable[int]
             ) -> dict[int, list[Mirror]]:
    """Each mirrored rank, as a :class:`Mirror` of the simulated rank of its stage."""
    reps = {schedule.stage_of(r): r for r in plan.programs}
    out: dict[int, list[Mirror]] = {r: [] for r in plan.programs}
    for x in mirrored:
        rep = reps[schedule.stage_of(x)]
        if int(schedule.program_of[x]) != int(schedule.program_of[rep]):
            raise PlanError(f"rank {x} runs another program than rank {rep}: cannot mirror it")
        prog = schedule.program(x)
        lanes: dict[str, str] = {}
        for op in plan.programs[rep]:
            if op.is_call:
                lane = planner.lane_of(x, schedule.op(x, prog.tag_index[op.tag]))
                if lanes.setdefault(op.lane, lane) != lane:
                    raise PlanError(f"rank {x} splits rank {rep}'s lane {op.lane}")
        out[rep].append(Mirror(x, lanes))
    return out


# --------------------------------------------------------------------------- the bench

def run_sim_bench(gpus: int, *, mirror: bool | None = None, rails: int = 1,
                  mode: str = "provisioning", switching_delay_ms: float = 25.0,
                  seed: int = 0, costs: str = FABRIC) -> dict[str, Any]:
    """``{"gpus", "wall_s", "cpu_s", "peak_rss_mb", "windows_per_iteration", ...}`` for one
    size.

    ``mirror`` (default: above 1024 GPUs, on one rail) simulates one pipeline chain of rail 0
    standing for the whole rail instead of every rank of rail 0 (see the module docstring);
    ``rails`` simulates every rank of rails ``0..rails-1`` (without mirrors); ``costs`` is the
    cost model (``fabric``: real bytes at 400 Gbit/s; ``emulator``: the emulator's costs at
    :data:`LINK_MBPS` with the bytes scaled).
    """
    with collector_paused():  # planning, run and metrics allocate millions of acyclic objects
        return _sim_bench(gpus, mirror=mirror, rails=rails, mode=mode,
                          switching_delay_ms=switching_delay_ms, seed=seed, costs=costs)


def _sim_bench(gpus: int, *, mirror: bool | None, rails: int, mode: str,
               switching_delay_ms: float, seed: int, costs: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    cfg = bench_experiment(gpus, mode=mode, switching_delay_ms=switching_delay_ms)
    schedule = generate_schedule(cfg.workload)
    link_mbps = RAIL_GBPS * 1e3 if costs == FABRIC else LINK_MBPS
    scale = link_mbps * 1e6 / (RAIL_GBPS * 1e9)
    mirror = gpus > 1024 and rails == 1 if mirror is None else mirror
    bench = plan_bench(cfg, schedule, mirror=mirror, rails=rails, scale=scale)
    t_plan = time.perf_counter() - t0
    net = network_model(link_mbps, cfg.latency_us, costs_of(costs))
    sim = PlanSimulation(bench.plan.programs, bench.job, cfg, network=net,
                         gpus_per_server=GPUS_PER_SERVER, seed=seed, mirrors=bench.mirrors)
    records, events = sim.run()
    t_sim = time.perf_counter() - t0 - t_plan
    m = compute_metrics(records, events, warmup=cfg.warmup, link_mbps=link_mbps, scale=scale,
                        num_rails=rails)
    rank0_windows = [w for w in m.windows if int(w["rank"]) == 0]
    wall_s = time.perf_counter() - t0
    modeled = max(e for _, e in simulate(schedule, TimingModel(rail_gbps=RAIL_GBPS)).values())
    s = m.summary
    return {
        "gpus": gpus, "wall_s": round(wall_s, 2),
        # CPU time of the process: what wall_s would be on an idle machine (a shared one
        # stretches wall_s, not this)
        "cpu_s": round(time.process_time() - cpu0, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "windows_per_iteration": len(rank0_windows) / cfg.iterations,
        "parallelism": f"TP8(SP) PP16 FSDP{gpus // 128}, 16 micro-batches x 8192 tokens",
        "mode": cfg.mode, "switching_delay_ms": cfg.switching_delay_ms, "costs": costs,
        "ports_per_rank": cfg.effective_ports_per_rank,
        "iteration_time_s": s["iteration_time_s"], "modeled_no_switching_s": round(modeled, 3),
        "reconfigurations_per_iteration": s["reconfigurations_per_iteration"],
        "exposed_reconfig_s": s["exposed_reconfig_s"],
        "iterations_simulated": cfg.total_iterations,
        "wall_plan_s": round(t_plan, 2), "wall_sim_s": round(t_sim, 2),
        "ranks_simulated": len(bench.plan.programs),
        "ranks_mirrored": sum(len(v) for v in bench.mirrors.values()),
        "ranks_controller": len(bench.controlled), "rails_simulated": rails,
        "rails": GPUS_PER_SERVER,
        "method": ("one pipeline chain of rail 0 standing for its DP rings" if mirror else
                   f"every rank of rails 0..{rails - 1}") + "; rails are independent in the replay "
                  "model",
        "mirror_error": MIRROR_ERROR if mirror else None,
        "events": sim.counters["events"], "flows": sim.counters["flows"],
        "controller_intents": sim.core.counters["intents"],
    }


def run_sim_benches(gpus: Sequence[int] = (1024, 16384), **options: Any) -> dict[str, Any]:
    """``{"results": [run_sim_bench(g) ...]}``, each size in a fresh process (its own peak RSS)."""
    ctx = multiprocessing.get_context("spawn")
    rows = []
    for g in gpus:
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            rows.append(pool.submit(run_sim_bench, g, **options).result())
    return {"results": rows}


if __name__ == "__main__":
    import json
    import sys

    sizes = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1024, 16384]
    print(json.dumps(run_sim_benches(sizes), indent=1))
