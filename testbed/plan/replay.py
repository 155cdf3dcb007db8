"""Replay plans: a schedule lowered to what each rank executes, and the job Opus registers.

Pure: no sockets, no Mininet. The emulated replayer (:mod:`testbed.emulated.replayer`) and the
simulation backend run the same plan, so they agree on what an iteration is.

Execution model (one iteration, repeated; a rank starts iteration ``i + 1`` once every op of
iteration ``i`` is done, as the optimizer step ends an iteration):

* **lanes** run their ops one after the other, each op waiting for its ``deps`` (indices into
  the rank's plan). The ``compute`` lane holds compute and scale-up (NVLink) collectives, merged
  into blocks of timed waits; every other lane is one Opus comm group and carries that group's
  network collectives in issue order, as NCCL runs a communicator's calls in order on its own
  stream while different communicators overlap.
* a compute block ends after any op that a network call depends on, and starts at any op that
  depends on a network call, so merging never delays or advances a dependency.
* a **call** is one collective: wrapped in the Opus shim, then its ``steps`` run in order; a step
  sends its transfers and waits for its receptions (ring algorithms of :mod:`workloads.steps`).
  Send/recv pairs become two-member comm groups ``p2p{a}-{b}``; within a run of send/recv ops
  with the same dependencies the sends come first, as ``batch_isend_irecv`` issues them.
* bytes are scaled by ``scale`` (emulated link rate / modelled rail rate) so transfer times stay
  real; every non-empty transfer keeps at least one byte. Switching delays are never scaled.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.job import CommGroup, JobError, JobSpec, RankPorts
from workloads.schedule import Op, Schedule
from workloads.steps import P2P_KINDS
from workloads.timing import TimingModel, collective_duration_s

COMPUTE_LANE = "compute"


class PlanError(ValueError):
    """A schedule that the replay cannot carry; the message says why and what to change."""


@dataclass(frozen=True)
class Step:
    """Transfers of one algorithm step: ``(peer, bytes)`` sent and received (scaled bytes)."""

    sends: tuple[tuple[int, int], ...] = ()
    recvs: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class PlanOp:
    """One op of a rank's plan: a compute block or a network call."""

    index: int
    lane: str
    deps: tuple[int, ...]
    duration_s: float = 0.0  # compute blocks
    kind: str = ""  # collective kind of a call
    axis: str = ""
    collective_id: str = ""  # the schedule's collective id (shared by all members)
    size_bytes: int = 0  # real message bytes (what the shim reports to Opus)
    wire_bytes: int = 0  # real bytes this rank sends
    steps: tuple[Step, ...] = ()
    tag: str = ""

    @property
    def is_call(self) -> bool:
        return self.lane != COMPUTE_LANE

    @property
    def sent_bytes(self) -> int:
        """Scaled bytes this rank sends in the call."""
        return sum(n for s in self.steps for _, n in s.sends)

    @property
    def expected_bytes(self) -> int:
        """Scaled bytes this rank must receive in the call."""
        return sum(n for s in self.steps for _, n in s.recvs)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"i": self.index, "lane": self.lane, "deps": list(self.deps)}
        if not self.is_call:
            out["duration_s"] = self.duration_s
            return out
        out.update(kind=self.kind, axis=self.axis, cid=self.collective_id,
                   size_bytes=self.size_bytes, wire_bytes=self.wire_bytes, tag=self.tag,
                   steps=[[[list(x) for x in s.sends], [list(x) for x in s.recvs]]
                          for s in self.steps])
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlanOp:
        steps = tuple(Step(tuple((int(p), int(n)) for p, n in s), tuple((int(p), int(n))
                                                                        for p, n in r))
                      for s, r in d.get("steps", []))
        return cls(int(d["i"]), str(d["lane"]), tuple(int(x) for x in d["deps"]),
                   float(d.get("duration_s", 0.0)), str(d.get("kind", "")),
                   str(d.get("axis", "")), str(d.get("cid", "")), int(d.get("size_bytes", 0)),
                   int(d.get("wire_bytes", 0)), steps, str(d.get("tag", "")))


@dataclass
class ReplayPlan:
    """Every rank's plan and the comm groups that Opus must know."""

    programs: dict[int, list[PlanOp]]
    groups: dict[str, CommGroup]
    scale: float
    lanes: dict[int, list[str]] = field(default_factory=dict)

    def job(self, job_id: str, ports: dict[int, RankPorts]) -> JobSpec:
        """The job for Opus, with the ranks' rail ports; refuses demands the ports can't carry."""
        try:
            return JobSpec(job_id, ports, self.groups)
        except JobError as exc:
            raise PlanError(f"{exc}. Use more ports per rank (ocs.ports_per_rank), or a "
                            "parallelism whose groups form rings on the rails") from exc


def scaled_bytes(size_bytes: int, scale: float) -> int:
    """Scaled size of a transfer; non-empty transfers keep at least one byte."""
    return 0 if size_bytes <= 0 else max(1, round(size_bytes * scale))


def pair_group_id(a: int, b: int) -> str:
    lo, hi = sorted((a, b))
    return f"p2p{lo}-{hi}"


def build_plan(schedule: Schedule, *, scale: float, rail_gbps: float = 200.0,
               latency_s: float = 5e-6, ranks: Iterable[int] | None = None) -> ReplayPlan:
    """Lower ``schedule`` to per-rank plans (see the module docstring)."""
    if not 0 < scale <= 1:
        raise PlanError(f"byte scale must be in (0, 1], got {scale}")
    model = TimingModel(rail_gbps=rail_gbps, latency_s=latency_s)
    groups: dict[str, CommGroup] = {}
    mesh_groups: set[str] = set()
    programs: dict[int, list[PlanOp]] = {}
    step_cache: dict[str, tuple[tuple[int, int, int], ...]] = {}
    lanes: dict[int, list[str]] = {}
    for rank in (range(schedule.world_size) if ranks is None else ranks):
        ops = _batch_order(schedule.ops_of(rank))
        programs[rank] = _lower_rank(schedule, rank, ops, scale, model, groups, mesh_groups,
                                     step_cache)
        lanes[rank] = list(dict.fromkeys(op.lane for op in programs[rank]))
    for gid in mesh_groups:
        g = groups[gid]
        pairs = tuple((a, b) for i, a in enumerate(g.ranks) for b in g.ranks[i + 1:]
                      if schedule.rail_of(a) == schedule.rail_of(b))
        groups[gid] = CommGroup(gid, g.axis, g.ranks, "pairs", pairs)
    return ReplayPlan(programs, groups, scale, lanes)


def _batch_order(ops: list[Op]) -> list[Op]:
    """Sends before receives within each run of adjacent send/recv ops with equal deps."""
    out: list[Op] = []
    i = 0
    while i < len(ops):
        j = i + 1
        if ops[i].kind in P2P_KINDS:
            while (j < len(ops) and ops[j].kind in P2P_KINDS and ops[j].deps == ops[i].deps
                   and ops[j].scale_up == ops[i].scale_up):
                j += 1
        run = ops[i:j]
        out.extend(sorted(run, key=lambda o: o.kind != "send") if len(run) > 1 else run)
        i = j
    return out


def _lower_rank(schedule: Schedule, rank: int, ops: Sequence[Op], scale: float,
                model: TimingModel, groups: dict[str, CommGroup], mesh_groups: set[str],
                step_cache: dict[str, tuple[tuple[int, int, int], ...]]) -> list[PlanOp]:
    is_net = {op.index: op.is_collective and not op.scale_up for op in ops}
    feeds_net = {d for op in ops if is_net[op.index] for d in op.deps if not is_net[d]}
    plan: list[PlanOp] = []
    where: dict[int, int] = {}  # schedule op index -> plan index
    block_start: int | None = None  # plan index of the open compute block
    block_s = 0.0
    block_deps: tuple[int, ...] = ()
    waited: set[int] = set()  # calls an earlier compute block waited for (the lane is in order)

    def close_block() -> None:
        nonlocal block_start
        if block_start is not None:
            plan[block_start] = PlanOp(block_start, COMPUTE_LANE, block_deps, block_s,
                                       tag=plan[block_start].tag)
            block_start = None

    for op in ops:
        if not is_net[op.index]:
            dur = op.duration_s if not op.is_collective else collective_duration_s(
                schedule, op, model)
            net_deps = tuple(dict.fromkeys(where[d] for d in op.deps
                                           if is_net[d] and where[d] not in waited))
            if block_start is None or net_deps:
                close_block()
                block_start, block_s, block_deps = len(plan), 0.0, net_deps
                waited.update(net_deps)
                plan.append(PlanOp(len(plan), COMPUTE_LANE, net_deps, tag=op.tag))
            block_s += dur
            where[op.index] = block_start
            if op.index in feeds_net:
                close_block()
            continue
        close_block()
        deps = tuple(dict.fromkeys(where[d] for d in op.deps))
        plan.append(_call(schedule, rank, op, len(plan), deps, scale, groups, mesh_groups,
                          step_cache))
        where[op.index] = len(plan) - 1
    close_block()
    return plan


def _call(schedule: Schedule, rank: int, op: Op, index: int, deps: tuple[int, ...],
          scale: float, groups: dict[str, CommGroup], mesh_groups: set[str],
          step_cache: dict[str, tuple[tuple[int, int, int], ...]]) -> PlanOp:
    if op.kind in P2P_KINDS:
        gid = pair_group_id(rank, op.peer)
        _same_rail(schedule, gid, rank, op.peer)
        if gid not in groups:
            a, b = sorted((rank, op.peer))
            groups[gid] = CommGroup(gid, op.axis, (a, b), "pairs", ((a, b),))
        n = scaled_bytes(op.size_bytes, scale)
        step = Step(sends=((op.peer, n),)) if op.kind == "send" else Step(recvs=((op.peer, n),))
        return PlanOp(index, gid, deps, kind=op.kind, axis=op.axis,
                      collective_id=op.collective_id, size_bytes=op.size_bytes,
                      wire_bytes=op.wire_bytes, steps=(step,), tag=op.tag)
    gid = op.group_id
    if gid not in groups:
        groups[gid] = CommGroup(gid, op.axis, schedule.group_ranks(gid), "ring")
    if op.kind == "all_to_all":
        mesh_groups.add(gid)
    transfers = step_cache.get(op.collective_id)
    if transfers is None:
        sp = schedule.step_plan(op.collective_id)
        transfers = tuple((k, t.src, t.dst) for k, step in enumerate(sp.steps) for t in step)
        sizes = {(k, t.src, t.dst): t.size_bytes for k, step in enumerate(sp.steps)
                 for t in step}
        step_cache[op.collective_id] = transfers
        step_cache[op.collective_id + "#sizes"] = tuple(
            (k, s, sizes[(k, s, d)]) for k, s, d in transfers)
        for _k, s, d in transfers:
            _same_rail(schedule, gid, s, d)
    sizes_t = step_cache[op.collective_id + "#sizes"]
    n_steps = 1 + max((k for k, _, _ in transfers), default=-1)
    sends: list[list[tuple[int, int]]] = [[] for _ in range(n_steps)]
    recvs: list[list[tuple[int, int]]] = [[] for _ in range(n_steps)]
    for (k, s, d), (_, _, size) in zip(transfers, sizes_t, strict=True):
        if s == rank:
            sends[k].append((d, scaled_bytes(size, scale)))
        if d == rank:
            recvs[k].append((s, scaled_bytes(size, scale)))
    steps = tuple(Step(tuple(sends[k]), tuple(recvs[k])) for k in range(n_steps))
    return PlanOp(index, gid, deps, kind=op.kind, axis=op.axis, collective_id=op.collective_id,
                  size_bytes=op.size_bytes, wire_bytes=op.wire_bytes, steps=steps, tag=op.tag)


def _same_rail(schedule: Schedule, gid: str, a: int, b: int) -> None:
    if schedule.rail_of(a) != schedule.rail_of(b):
        raise PlanError(
            f"group {gid}: ranks {a} and {b} talk across rails ({schedule.rail_of(a)} and "
            f"{schedule.rail_of(b)}); the replay carries rail-aligned traffic only. Let TP fill "
            "the server (tp = gpus_per_server) so that the other groups are rail-aligned")
