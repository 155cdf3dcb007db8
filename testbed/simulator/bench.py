"""``opus-testbed bench sim``: the sim backend on Llama3.1-405B at 1024 and 16384 H100s.

Parallelism of the Llama 3 paper for that model: TP 8 inside a server (with SP), PP 16, no CP,
FSDP over the rest (8 at 1024 GPUs, 128 at 16384), 16 micro-batches of one 8192-token
sequence, 1F1B. Rails: one per local GPU (8), two ports per GPU and rail (a DP or PP ring needs
two circuits per GPU), 400 Gbit/s per GPU, 25 ms switching, provisioning. The network model is
the modelled fabric alone (:data:`testbed.simulator.engine.IDEAL_COSTS`): no emulator overheads at
this scale. One warm-up iteration (the profiling one) and one measured iteration run.

What is simulated. In the replay model rails are independent: scale-up (TP) collectives are
timed compute, every network group is rail-aligned and the controller plans each rail on its
own, so rail 0 alone gives the same times as all eight rails. At 1024 GPUs every rank of rail 0
(128) runs its own plan. At 16384 GPUs (2048 ranks per rail) the ranks of one pipeline chain
(one per stage, 16) run their plans and each stands for the 127 other ranks of its DP ring on
rail 0 (:class:`~testbed.simulator.engine.Mirror`): the controller still sees every intent and
completion of all 2048 ranks and switches all their circuits, but transfers are simulated for
the 16 only. ``ranks_simulated``, ``ranks_mirrored`` and ``rails_simulated`` say what ran.

Plans are lowered by :func:`fast_plan`: one :func:`testbed.plan.replay.build_plan` per program (the
compute blocks are the same for every rank of a program whose groups stay on or off the
network alike) and the network calls re-bound per rank, with ring steps computed per rank
instead of lowering whole collectives (the tests check it equals :func:`build_plan`).
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from controller.job import CommGroup, JobSpec, rail_job_ports
from testbed.experiment.config import ExperimentConfig
from testbed.metrics.compute import compute_metrics
from testbed.plan import replay as plan_module
from testbed.plan.replay import PlanError, PlanOp, ReplayPlan, Step, pair_group_id, scaled_bytes
from testbed.simulator.engine import Mirror, PlanSimulation
from testbed.simulator.network import IDEAL_COSTS, network_model
from workloads.builder import generate_schedule
from workloads.config import ParallelConfig, WorkloadConfig
from workloads.hardware import Cluster, get_gpu
from workloads.models import get_preset
from workloads.schedule import Op, Schedule
from workloads.steps import P2P_KINDS, RING_KINDS, chunk_sizes
from workloads.timing import TimingModel, simulate

GPUS_PER_SERVER = 8
RAIL_GBPS = 400.0
LINK_MBPS = 1000.0  # only sets the byte scale (4e-6 x 250): times are real bytes at 400 Gbit/s


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


# ------------------------------------------------------------------------- fast lowering

def _net_signature(schedule: Schedule, rank: int, axes: Sequence[str],
                   peer_stages: Sequence[int]) -> tuple[bool, ...]:
    """Which of the rank's groups stay inside its server: equal signatures lower alike."""
    flags = [bool(schedule.group_scale_up(a)[int(schedule.rank_index(a).group[rank])])
             for a in axes]
    flags += [schedule.server_of(schedule.peer_rank(rank, s)) == schedule.server_of(rank)
              for s in peer_stages]
    return tuple(flags)


class _Lowering:
    """Per-rank network calls of a schedule, with per-collective member caches."""

    def __init__(self, schedule: Schedule, scale: float) -> None:
        self.schedule = schedule
        self.scale = scale
        self.groups: dict[str, CommGroup] = {}
        self._members: dict[str, tuple[str, tuple[int, ...], list[int]]] = {}
        self._position: dict[str, dict[int, int]] = {}
        self._mesh: dict[str, dict[int, tuple[Step, ...]]] = {}

    def group_of(self, rank: int, op: Op) -> str:
        """The comm group (lane) of a bound network op, registering it."""
        s = self.schedule
        if op.kind in P2P_KINDS:
            gid = pair_group_id(rank, op.peer)
            if s.rail_of(rank) != s.rail_of(op.peer):
                raise PlanError(f"group {gid}: ranks {rank} and {op.peer} talk across rails")
            if gid not in self.groups:
                a, b = sorted((rank, op.peer))
                self.groups[gid] = CommGroup(gid, op.axis, (a, b), "pairs", ((a, b),))
            return gid
        gid = op.group_id
        if gid not in self.groups:
            ranks = s.group_ranks(gid)
            if len({s.rail_of(r) for r in ranks}) > 1:
                raise PlanError(f"group {gid} spans rails; use build_plan for its message")
            if op.kind == "all_to_all":
                pairs = tuple((a, b) for i, a in enumerate(ranks) for b in ranks[i + 1:])
                self.groups[gid] = CommGroup(gid, op.axis, ranks, "pairs", pairs)
            else:
                self.groups[gid] = CommGroup(gid, op.axis, ranks, "ring")
        return gid

    def call(self, rank: int, op: Op, index: int, deps: tuple[int, ...]) -> PlanOp:
        """The :class:`PlanOp` that :func:`build_plan` makes of network op ``op``."""
        gid = self.group_of(rank, op)
        if op.kind in P2P_KINDS:
            n = scaled_bytes(op.size_bytes, self.scale)
            step = (Step(sends=((op.peer, n),)) if op.kind == "send"
                    else Step(recvs=((op.peer, n),)))
            steps: tuple[Step, ...] = (step,)
        else:
            steps = self._steps(op.collective_id, rank)
        return PlanOp(index, gid, deps, kind=op.kind, axis=op.axis,
                      collective_id=op.collective_id, size_bytes=op.size_bytes,
                      wire_bytes=op.wire_bytes, steps=steps, tag=op.tag)

    def transfers(self, cid: str, rank: int) -> list[tuple[int, int, int, int]] | None:
        """``(step, src, dst, bytes)`` of ``rank`` in ring collective ``cid`` (None: not a ring).

        The transfers of :func:`workloads.steps.lower` that involve ``rank``, without lowering
        the whole collective.
        """
        info = self._members.get(cid)
        if info is None:
            members = self.schedule.collective_members(cid)
            info = (members[0].kind, tuple(m.rank for m in members),
                    [m.size_bytes for m in members])
            self._members[cid] = info
            self._position[cid] = {r: i for i, r in enumerate(info[1])}
        kind, ranks, sizes = info
        if kind not in RING_KINDS:
            return None
        n = len(ranks)
        if n < 2:
            return []
        i = self._position[cid][rank]
        me, nxt, prv = rank, ranks[(i + 1) % n], ranks[(i - 1) % n]
        out = []
        if kind == "all_gather":
            for k in range(n - 1):
                out += [(k, me, nxt, sizes[(i - k) % n]), (k, prv, me, sizes[(i - 1 - k) % n])]
            return out
        c = chunk_sizes(sizes[0], n)
        for k in range(n - 1):
            out += [(k, me, nxt, c[(i - k - 1) % n]), (k, prv, me, c[(i - k - 2) % n])]
        if kind == "all_reduce":
            for k in range(n - 1):
                j = n - 1 + k
                out += [(j, me, nxt, c[(i - k) % n]), (j, prv, me, c[(i - k - 1) % n])]
        return out

    def _steps(self, cid: str, rank: int) -> tuple[Step, ...]:
        moves = self.transfers(cid, rank)
        if moves is None:
            return self._mesh_steps(cid, rank)
        n_steps = 1 + max((k for k, _, _, _ in moves), default=-1)
        sends: list[list[tuple[int, int]]] = [[] for _ in range(n_steps)]
        recvs: list[list[tuple[int, int]]] = [[] for _ in range(n_steps)]
        for k, src, dst, size in moves:
            if src == rank:
                sends[k].append((dst, scaled_bytes(size, self.scale)))
            if dst == rank:
                recvs[k].append((src, scaled_bytes(size, self.scale)))
        return tuple(Step(tuple(sends[k]), tuple(recvs[k])) for k in range(n_steps))

    def template(self, rank: int, rail_gbps: float, latency_s: float) -> list[PlanOp]:
        """``rank``'s plan by :mod:`testbed.plan.replay`'s own lowering, fed only its transfers."""
        cache: dict[str, tuple[tuple[int, int, int], ...]] = {}
        ops = plan_module._batch_order(self.schedule.ops_of(rank))
        for op in ops:
            if op.is_collective and not op.scale_up and op.kind not in P2P_KINDS:
                moves = self.transfers(op.collective_id, rank)
                if moves is not None:
                    cache[op.collective_id] = tuple((k, a, b) for k, a, b, _ in moves)
                    cache[op.collective_id + "#sizes"] = tuple((k, a, n) for k, a, _, n in moves)
        mesh: set[str] = set()
        groups: dict[str, CommGroup] = {}
        out = plan_module._lower_rank(self.schedule, rank, ops, self.scale,
                                      TimingModel(rail_gbps=rail_gbps, latency_s=latency_s),
                                      groups, mesh, cache)
        rail_of = self.schedule.rail_of
        for gid, g in groups.items():
            if gid in mesh:  # as build_plan: all-to-all groups join their members pairwise
                g = CommGroup(gid, g.axis, g.ranks, "pairs",
                              tuple((a, b) for i, a in enumerate(g.ranks) for b in g.ranks[i + 1:]
                                    if rail_of(a) == rail_of(b)))
            self.groups.setdefault(gid, g)
        return out

    def _mesh_steps(self, cid: str, rank: int) -> tuple[Step, ...]:
        per_rank = self._mesh.get(cid)
        if per_rank is None:
            sp = self.schedule.step_plan(cid)
            sends: dict[int, list[list[tuple[int, int]]]] = {}
            recvs: dict[int, list[list[tuple[int, int]]]] = {}
            n_steps = len(sp.steps)
            for k, step in enumerate(sp.steps):
                for t in step:
                    n = scaled_bytes(t.size_bytes, self.scale)
                    sends.setdefault(t.src, [[] for _ in range(n_steps)])[k].append((t.dst, n))
                    recvs.setdefault(t.dst, [[] for _ in range(n_steps)])[k].append((t.src, n))
            empty: list[list[tuple[int, int]]] = [[] for _ in range(n_steps)]
            per_rank = {r: tuple(Step(tuple(sends.get(r, empty)[k]), tuple(recvs.get(r, empty)[k]))
                                 for k in range(n_steps)) for r in sp.ranks}
            self._mesh[cid] = per_rank
        return per_rank[rank]


def fast_plan(schedule: Schedule, *, scale: float, rail_gbps: float = 200.0,
              latency_s: float = 5e-6, ranks: Iterable[int] | None = None) -> ReplayPlan:
    """:func:`testbed.plan.replay.build_plan` of ``ranks``, lowering each program's compute once."""
    chosen = list(range(schedule.world_size)) if ranks is None else list(ranks)
    low = _Lowering(schedule, scale)
    programs: dict[int, list[PlanOp]] = {}
    lanes: dict[int, list[str]] = {}
    templates: dict[tuple[int, tuple[bool, ...]], list[PlanOp]] = {}
    shapes: dict[int, tuple[list[str], list[int]]] = {}
    for r in chosen:
        prog_idx = int(schedule.program_of[r])
        if prog_idx not in shapes:
            prog = schedule.programs[prog_idx]
            axes = sorted({t.axis for t in prog.ops if t.is_collective
                           and t.kind not in P2P_KINDS})
            stages = sorted({t.peer_stage for t in prog.ops if t.kind in P2P_KINDS})
            shapes[prog_idx] = (axes, stages)
        key = (prog_idx, _net_signature(schedule, r, *shapes[prog_idx]))
        template = templates.get(key)
        if template is None:
            templates[key] = programs[r] = low.template(r, rail_gbps, latency_s)
        else:
            prog = schedule.programs[prog_idx]
            programs[r] = [op if not op.is_call else
                           low.call(r, schedule.op(r, prog.tag_index[op.tag]), op.index,
                                    op.deps)
                           for op in template]
        lanes[r] = list(dict.fromkeys(op.lane for op in programs[r]))
    return ReplayPlan(programs, dict(low.groups), scale, lanes)


# --------------------------------------------------------------------------- the bench

def _mirrors(schedule: Schedule, plan: ReplayPlan, mirrored: Iterable[int], scale: float
             ) -> tuple[dict[int, list[Mirror]], dict[str, CommGroup]]:
    """Each mirrored rank, as a :class:`Mirror` of the simulated rank of its stage."""
    low = _Lowering(schedule, scale)
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
                lane = low.group_of(x, schedule.op(x, prog.tag_index[op.tag]))
                if lanes.setdefault(op.lane, lane) != lane:
                    raise PlanError(f"rank {x} splits rank {rep}'s lane {op.lane}")
        out[rep].append(Mirror(x, lanes))
    return out, low.groups


def run_sim_bench(gpus: int, *, mirror: bool | None = None, rails: int = 1,
                  mode: str = "provisioning", switching_delay_ms: float = 25.0,
                  seed: int = 0) -> dict[str, Any]:
    """``{"gpus", "wall_s", "peak_rss_mb", "windows_per_iteration", ...}`` for one size.

    ``mirror`` (default: above 1024 GPUs) simulates one pipeline chain of rail 0 standing for
    the whole rail instead of every rank of rail 0 (see the module docstring); ``rails``
    simulates rails ``0..rails-1`` (without mirrors) to check that they are independent.
    """
    t0 = time.perf_counter()
    cfg = bench_experiment(gpus, mode=mode, switching_delay_ms=switching_delay_ms)
    schedule = generate_schedule(cfg.workload)
    scale = LINK_MBPS * 1e6 / (RAIL_GBPS * 1e9)
    mirror = gpus > 1024 if mirror is None else mirror
    if mirror and rails != 1:
        raise ValueError("mirrored runs simulate rail 0 only")
    rail0 = [r for r in range(schedule.world_size) if schedule.rail_of(r) < rails]
    per_stage = schedule.world_size // cfg.workload.parallel.pp
    simulated = [s * per_stage for s in range(cfg.workload.parallel.pp)] if mirror else rail0
    plan = fast_plan(schedule, scale=scale, rail_gbps=RAIL_GBPS, latency_s=5e-6,
                     ranks=simulated)
    groups = dict(plan.groups)
    mirrors: dict[int, list[Mirror]] = {}
    if mirror:
        sim_set = set(simulated)
        mirrors, more = _mirrors(schedule, plan, [r for r in rail0 if r not in sim_set], scale)
        groups.update(more)
    job = JobSpec("train", rail_job_ports(rail0, GPUS_PER_SERVER, cfg.effective_ports_per_rank),
                  groups)
    t_plan = time.perf_counter() - t0
    net = network_model(LINK_MBPS, cfg.latency_us, IDEAL_COSTS)
    sim = PlanSimulation(plan.programs, job, mode=cfg.mode,
                         switching_delay=cfg.switching_delay, iterations=cfg.total_iterations,
                         network=net, gpus_per_server=GPUS_PER_SERVER, seed=seed,
                         mirrors=mirrors)
    records, events = sim.run()
    t_sim = time.perf_counter() - t0 - t_plan
    m = compute_metrics(records, events, warmup=cfg.warmup, link_mbps=LINK_MBPS, scale=scale,
                        num_rails=rails)
    rank0_windows = [w for w in m.windows if int(w["rank"]) == 0]
    wall_s = time.perf_counter() - t0
    modeled = max(e for _, e in simulate(schedule, TimingModel(rail_gbps=RAIL_GBPS)).values())
    s = m.summary
    return {
        "gpus": gpus, "wall_s": round(wall_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "windows_per_iteration": len(rank0_windows) / cfg.iterations,
        "parallelism": f"TP8(SP) PP16 FSDP{gpus // 128}, 16 micro-batches x 8192 tokens",
        "mode": cfg.mode, "switching_delay_ms": cfg.switching_delay_ms,
        "ports_per_rank": cfg.effective_ports_per_rank,
        "iteration_time_s": s["iteration_time_s"], "modeled_no_switching_s": round(modeled, 3),
        "reconfigurations_per_iteration": s["reconfigurations_per_iteration"],
        "exposed_reconfig_s": s["exposed_reconfig_s"],
        "iterations_simulated": cfg.total_iterations,
        "wall_plan_s": round(t_plan, 2), "wall_sim_s": round(t_sim, 2),
        "ranks_simulated": len(simulated), "ranks_mirrored": sum(len(v) for v in mirrors.values()),
        "ranks_controller": len(rail0), "rails_simulated": rails, "rails": GPUS_PER_SERVER,
        "method": ("one pipeline chain of rail 0 standing for its DP rings" if mirror else
                   f"every rank of rails 0..{rails - 1}") + "; rails are independent in the replay "
                  "model",
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
