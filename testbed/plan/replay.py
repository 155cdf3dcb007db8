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
from functools import cached_property
from typing import Any

from controller.job import CommGroup, JobError, JobSpec, RankPorts
from workloads.schedule import MAIN_THREAD, Op, Schedule
from workloads.steps import P2P_KINDS, RING_KINDS, chunk_sizes, ring_sends
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
    thread: str = MAIN_THREAD  # the host thread that issues the call (main | autograd)
    # Rail-state request points (:mod:`testbed.plan.requestpoints`): an ungated call never talks
    # to the controller; after a call with ``predict`` >= 0 the rank provisions the call at
    # that plan index (in the next iteration when it is not after this one).
    gated: bool = True
    predict: int = -1

    @property
    def is_call(self) -> bool:
        return self.lane != COMPUTE_LANE

    @cached_property
    def expected_bytes(self) -> int:
        """Scaled bytes this rank must receive in the call (summed once: the simulator asks at
        the end of every call, and a ring call of a 16k-GPU run has hundreds of steps)."""
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
        if self.thread != MAIN_THREAD:
            out["thread"] = self.thread
        if not self.gated:
            out["gated"] = False
        if self.predict >= 0:
            out["predict"] = self.predict
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlanOp:
        steps = tuple(Step(tuple((int(p), int(n)) for p, n in s), tuple((int(p), int(n))
                                                                        for p, n in r))
                      for s, r in d.get("steps", []))
        return cls(int(d["i"]), str(d["lane"]), tuple(int(x) for x in d["deps"]),
                   float(d.get("duration_s", 0.0)), str(d.get("kind", "")),
                   str(d.get("axis", "")), str(d.get("cid", "")), int(d.get("size_bytes", 0)),
                   int(d.get("wire_bytes", 0)), steps, str(d.get("tag", "")),
                   str(d.get("thread", MAIN_THREAD)), bool(d.get("gated", True)),
                   int(d.get("predict", -1)))


@dataclass
class ReplayPlan:
    """Every rank's plan and the comm groups that Opus must know."""

    programs: dict[int, list[PlanOp]]
    groups: dict[str, CommGroup]
    scale: float
    lanes: dict[int, list[str]] = field(default_factory=dict)
    stages: dict[int, int] = field(default_factory=dict)  # rank -> pipeline stage (all ranks)

    def job(self, job_id: str, ports: dict[int, RankPorts]) -> JobSpec:
        """The job for Opus, with the ranks' rail ports; refuses demands the ports can't carry."""
        stages = ({r: self.stages[r] for r in ports} if self.stages and set(ports) <= set(
            self.stages) else None)
        try:
            return JobSpec(job_id, ports, self.groups, stages)
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
    """Lower ``schedule`` to per-rank plans (see the module docstring): every rank, or ``ranks``."""
    return Planner(schedule, scale=scale, rail_gbps=rail_gbps, latency_s=latency_s).plan(ranks)


@dataclass(frozen=True)
class _Ring:
    """The members of one ring collective, for lowering it one member at a time."""

    kind: str
    ranks: tuple[int, ...]
    sizes: tuple[int, ...]
    chunks: tuple[int, ...]
    position: dict[int, int]


class Planner:
    """Lowers a schedule rank by rank, doing the work that ranks share once.

    Ranks of one program whose collectives stay on or off the network alike (and, for the
    scale-up ones, sit at the same group position, which sets their bytes) get the same compute
    blocks and call structure: the first such rank is lowered in full, the others re-bind its
    calls to their own groups and peers. A ring collective is lowered per member
    (:func:`workloads.steps.ring_sends`), never as a whole, so planning a few ranks of a
    16k-GPU schedule stays cheap. :func:`build_plan` is one planner over the ranks asked for;
    the scale bench also names the lanes of ranks it does not plan (:meth:`lane_of`).
    """

    def __init__(self, schedule: Schedule, *, scale: float, rail_gbps: float = 200.0,
                 latency_s: float = 5e-6) -> None:
        if not 0 < scale <= 1:
            raise PlanError(f"byte scale must be in (0, 1], got {scale}")
        self.schedule = schedule
        self.scale = scale
        self.model = TimingModel(rail_gbps=rail_gbps, latency_s=latency_s)
        self._groups: dict[str, CommGroup] = {}
        self._mesh_groups: set[str] = set()
        self._templates: dict[tuple[int, tuple[int, ...]], list[PlanOp]] = {}
        self._program_axes: dict[int, tuple[list[str], list[int]]] = {}
        self._rings: dict[str, _Ring] = {}
        self._one_rail: set[str] = set()  # ring groups whose ranks share one rail
        self._meshes: dict[str, dict[int, tuple[Step, ...]]] = {}
        # ring steps by (kind, position, sizes, to, from), and distinct steps (see _ring_steps)
        self._ring_cache: dict[tuple[str, int, tuple[int, ...], int, int], tuple[Step, ...]] = {}
        self._steps: dict[tuple[int, int, int, int], Step] = {}

    def plan(self, ranks: Iterable[int] | None = None) -> ReplayPlan:
        """The plans of ``ranks`` (default: every rank) and the comm groups named so far."""
        programs: dict[int, list[PlanOp]] = {}
        lanes: dict[int, list[str]] = {}
        for rank in (range(self.schedule.world_size) if ranks is None else ranks):
            programs[rank] = self.lower(rank)
            lanes[rank] = list(dict.fromkeys(op.lane for op in programs[rank]))
        stages = {r: self.schedule.stage_of(r) for r in range(self.schedule.world_size)}
        return ReplayPlan(programs, self.groups(), self.scale, lanes, stages)

    def groups(self) -> dict[str, CommGroup]:
        """Comm groups of the calls lowered and lanes named so far.

        An all-to-all group joins its members pairwise (the pairs on one rail).
        """
        out = dict(self._groups)
        rail_of = self.schedule.rail_of
        for gid in self._mesh_groups:
            g = out[gid]
            pairs = tuple((a, b) for i, a in enumerate(g.ranks) for b in g.ranks[i + 1:]
                          if rail_of(a) == rail_of(b))
            out[gid] = CommGroup(gid, g.axis, g.ranks, "pairs", pairs)
        return out

    def lane_of(self, rank: int, op: Op) -> str:
        """The lane (comm group id) of network op ``op`` of ``rank``; registers its group."""
        if op.kind in P2P_KINDS:
            gid = pair_group_id(rank, op.peer)
            self._same_rail(gid, rank, op.peer)
            if gid not in self._groups:
                a, b = sorted((rank, op.peer))
                self._groups[gid] = CommGroup(gid, op.axis, (a, b), "pairs", ((a, b),))
            return gid
        gid = op.group_id
        if gid not in self._groups:
            self._groups[gid] = CommGroup(gid, op.axis, self.schedule.group_ranks(gid), "ring")
        if op.kind == "all_to_all":
            self._mesh_groups.add(gid)
        return gid

    def lower(self, rank: int) -> list[PlanOp]:
        """``rank``'s plan."""
        s = self.schedule
        program = int(s.program_of[rank])
        key = (program, self._shape(rank, program))
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = self._lower_ops(rank, _batch_order(s.ops_of(rank)))
            return list(template)
        tags = s.programs[program].tag_index
        return [self.call(rank, s.op(rank, tags[op.tag]), op.index, op.deps) if op.is_call
                else op for op in template]

    def call(self, rank: int, op: Op, index: int, deps: tuple[int, ...]) -> PlanOp:
        """Network op ``op`` of ``rank`` as the call at ``index`` of its plan."""
        lane = self.lane_of(rank, op)
        if op.kind in P2P_KINDS:
            n = scaled_bytes(op.size_bytes, self.scale)
            steps: tuple[Step, ...] = (Step(sends=((op.peer, n),)) if op.kind == "send"
                                       else Step(recvs=((op.peer, n),)),)
        elif op.kind in RING_KINDS:
            steps = self._ring_steps(lane, op)
        else:
            steps = self._mesh_steps(lane, op)
        return PlanOp(index, lane, deps, kind=op.kind, axis=op.axis,
                      collective_id=op.collective_id, size_bytes=op.size_bytes,
                      wire_bytes=op.wire_bytes, steps=steps, tag=op.tag, thread=op.thread)

    def _shape(self, rank: int, program: int) -> tuple[int, ...]:
        """What sets the lowering of ``rank`` beyond its program: per collective axis, -1 when
        its group uses the network, else the rank's position in it; per pipeline peer, whether
        it shares the rank's server."""
        s = self.schedule
        if program not in self._program_axes:
            ops = s.programs[program].ops
            self._program_axes[program] = (
                sorted({t.axis for t in ops if t.is_collective and t.kind not in P2P_KINDS}),
                sorted({t.peer_stage for t in ops if t.kind in P2P_KINDS}))
        axes, peer_stages = self._program_axes[program]
        out = []
        for axis in axes:
            index = s.rank_index(axis)
            scale_up = bool(s.group_scale_up(axis)[int(index.group[rank])])
            out.append(int(index.position[rank]) if scale_up else -1)
        out += [int(s.server_of(s.peer_rank(rank, stage)) == s.server_of(rank))
                for stage in peer_stages]
        return tuple(out)

    def _lower_ops(self, rank: int, ops: Sequence[Op]) -> list[PlanOp]:
        is_net = {op.index: op.is_collective and not op.scale_up for op in ops}
        feeds_net = {d for op in ops if is_net[op.index] for d in op.deps if not is_net[d]}
        plan: list[PlanOp] = []
        where: dict[int, int] = {}  # schedule op index -> plan index
        block_start: int | None = None  # plan index of the open compute block
        block_s = 0.0
        block_deps: tuple[int, ...] = ()
        waited: set[int] = set()  # calls an earlier compute block waited for (lanes run in order)

        def close_block() -> None:
            nonlocal block_start
            if block_start is not None:
                plan[block_start] = PlanOp(block_start, COMPUTE_LANE, block_deps, block_s,
                                           tag=plan[block_start].tag)
                block_start = None

        for op in ops:
            if not is_net[op.index]:
                dur = op.duration_s if not op.is_collective else collective_duration_s(
                    self.schedule, op, self.model)
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
            plan.append(self.call(rank, op, len(plan), deps))
            where[op.index] = len(plan) - 1
        close_block()
        return plan

    def _ring_steps(self, lane: str, op: Op) -> tuple[Step, ...]:
        ring = self._rings.get(op.collective_id)
        if ring is None:
            members = self.schedule.collective_members(op.collective_id)
            ranks = tuple(m.rank for m in members)
            if lane not in self._one_rail:
                group = self.schedule.group_ranks(lane)
                if len({self.schedule.rail_of(r) for r in group}) == 1:
                    self._one_rail.add(lane)  # then no ring of the group crosses rails
                elif len(ranks) > 1:
                    for a, b in zip(ranks, ranks[1:] + ranks[:1], strict=True):
                        self._same_rail(lane, a, b)
            sizes = tuple(m.size_bytes for m in members)
            chunks = tuple(chunk_sizes(sizes[0], len(ranks))) if ranks else ()
            ring = self._rings[op.collective_id] = _Ring(
                op.kind, ranks, sizes, chunks, {r: i for i, r in enumerate(ranks)})
        n = len(ring.ranks)
        i = ring.position[op.rank]
        to, frm = ring.ranks[(i + 1) % n], ring.ranks[(i - 1) % n]
        # a member's steps follow from (kind, position, sizes) and its two neighbours: ranks
        # reuse them over the calls of a group, and share the Step objects (a 16k-GPU rail's
        # plans hold millions of steps but only thousands of distinct ones)
        key = (ring.kind, i, ring.sizes, to, frm)
        steps = self._ring_cache.get(key)
        if steps is None:
            sent = ring_sends(ring.kind, n, i, ring.sizes, ring.chunks)
            received = ring_sends(ring.kind, n, (i - 1) % n, ring.sizes, ring.chunks)
            steps = self._ring_cache[key] = tuple(
                self._ring_step(to, a, frm, b) for a, b in zip(sent, received, strict=True))
        return steps

    def _ring_step(self, to: int, sent_bytes: int, frm: int, received_bytes: int) -> Step:
        """The step sending ``sent_bytes`` (unscaled) to ``to`` and receiving
        ``received_bytes`` from ``frm``, one object per distinct step."""
        key = (to, sent_bytes, frm, received_bytes)
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = Step(((to, scaled_bytes(sent_bytes, self.scale)),),
                                           ((frm, scaled_bytes(received_bytes, self.scale)),))
        return step

    def _mesh_steps(self, lane: str, op: Op) -> tuple[Step, ...]:
        per_rank = self._meshes.get(op.collective_id)
        if per_rank is None:
            plan = self.schedule.step_plan(op.collective_id)
            n_steps = len(plan.steps)
            sends: dict[int, list[list[tuple[int, int]]]] = {
                r: [[] for _ in range(n_steps)] for r in plan.ranks}
            recvs: dict[int, list[list[tuple[int, int]]]] = {
                r: [[] for _ in range(n_steps)] for r in plan.ranks}
            for k, step in enumerate(plan.steps):
                for t in step:
                    self._same_rail(lane, t.src, t.dst)
                    n = scaled_bytes(t.size_bytes, self.scale)
                    sends[t.src][k].append((t.dst, n))
                    recvs[t.dst][k].append((t.src, n))
            per_rank = self._meshes[op.collective_id] = {
                r: tuple(Step(tuple(sends[r][k]), tuple(recvs[r][k])) for k in range(n_steps))
                for r in plan.ranks}
        return per_rank[op.rank]

    def _same_rail(self, gid: str, a: int, b: int) -> None:
        rail_of = self.schedule.rail_of
        if rail_of(a) != rail_of(b):
            raise PlanError(
                f"group {gid}: ranks {a} and {b} talk across rails ({rail_of(a)} and "
                f"{rail_of(b)}); the replay carries rail-aligned traffic only. Let TP fill the "
                "server (tp = gpus_per_server) so that the other groups are rail-aligned")


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
