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
  sends its transfers and waits for its receptions (the algorithms of
  :mod:`workloads.algorithms`); a ``sync`` step also waits until its own sends have arrived.
  Send/recv pairs become two-member comm groups ``p2p{a}-{b}``; within a run of send/recv ops
  with the same dependencies the sends come first, as ``batch_isend_irecv`` issues them.
* a call of an algorithm whose steps need circuits of their own (``matchings``, ``stragglar``)
  runs as **segments**: steps ``[first, first + count)`` under comm group
  ``{group}.{segment}``, one Opus call each (intent, ack, steps, completion), so the OCS is
  rewired between segments. Rounds are packed into one segment while their circuits fit the
  rank's K ports (all at once on electrical rails, where no circuit limits them). A rank's
  steps keep the collective's numbering (empty where it sits a round out) and it runs only the
  segments it takes part in. Other calls are one implicit segment: the lane's group.
* a straggler (``workload.stragglers``) gets a compute block of its delay before each of its
  network all-reduces, which then wait for it.
* ``verify`` plans (tests) carry the collectives' data: each transfer names the blocks it moves
  and each call lists its blocks (scaled bytes, contributors, owners), so a replayer can send
  real payloads and check what every rank ends with.
* bytes are scaled by ``scale`` (emulated link rate / modelled rail rate) so transfer times stay
  real; every non-empty transfer keeps at least one byte. Switching delays are never scaled.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from controller.job import CommGroup, JobError, JobSpec, RankPorts
from workloads.algorithms import ALGORITHM, DEFAULT_ALGORITHM, Segment, pack_segments
from workloads.steps import P2P_KINDS, RING_KINDS, StepPlan, Transfer, chunk_sizes, ring_sends
from workloads.threads import MAIN_THREAD

if TYPE_CHECKING:  # the planner's inputs; a rank process reading its plan never loads them
    from workloads.schedule import Op, Schedule

COMPUTE_LANE = "compute"


class PlanError(ValueError):
    """A schedule that the replay cannot carry; the message says why and what to change."""


BlockOps = tuple[tuple[int, str], ...]  # (block id, "add" | "copy") carried by one transfer


@dataclass(frozen=True)
class Step:
    """Transfers of one algorithm step: ``(peer, bytes)`` sent and received (scaled bytes).

    ``sync``: the step ends when its sends have arrived too. ``send_blocks[i]`` /
    ``recv_blocks[j]`` (verify plans only) are the blocks ``sends[i]`` / ``recvs[j]`` carry.
    """

    sends: tuple[tuple[int, int], ...] = ()
    recvs: tuple[tuple[int, int], ...] = ()
    sync: bool = False
    send_blocks: tuple[BlockOps, ...] = ()
    recv_blocks: tuple[BlockOps, ...] = ()

    def to_json(self) -> list[Any]:
        out: list[Any] = [[list(x) for x in self.sends], [list(x) for x in self.recvs]]
        extra: dict[str, Any] = {}
        if self.sync:
            extra["sync"] = True
        if self.send_blocks or self.recv_blocks:
            extra.update(send_blocks=[[list(b) for b in x] for x in self.send_blocks],
                         recv_blocks=[[list(b) for b in x] for x in self.recv_blocks])
        return [*out, extra] if extra else out

    @classmethod
    def from_json(cls, d: list[Any]) -> Step:
        extra = d[2] if len(d) > 2 else {}
        return cls(tuple((int(p), int(n)) for p, n in d[0]),
                   tuple((int(p), int(n)) for p, n in d[1]), bool(extra.get("sync", False)),
                   _block_ops(extra.get("send_blocks", ())),
                   _block_ops(extra.get("recv_blocks", ())))


def _block_ops(d: Any) -> tuple[BlockOps, ...]:
    return tuple(tuple((int(b), str(o)) for b, o in x) for x in d)


@dataclass(frozen=True)
class PlanSegment:
    """Steps ``[first, first + count)`` of a call, served by comm group ``group`` (one Opus
    call: intent, ack, the steps, completion)."""

    group: str
    first: int
    count: int


# (block id, scaled bytes, contributors, owners) of a verify plan's call
PlanBlock = tuple[int, int, tuple[int, ...], tuple[int, ...]]


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
    segments: tuple[PlanSegment, ...] = ()  # empty: one, the lane's group over every step
    blocks: tuple[PlanBlock, ...] = ()  # verify plans: the call's data blocks

    @property
    def is_call(self) -> bool:
        return self.lane != COMPUTE_LANE

    @property
    def call_segments(self) -> tuple[PlanSegment, ...]:
        """The segments the call runs, the implicit one included."""
        return self.segments or (PlanSegment(self.lane, 0, len(self.steps)),)

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
                   steps=[s.to_json() for s in self.steps])
        if self.thread != MAIN_THREAD:
            out["thread"] = self.thread
        if not self.gated:
            out["gated"] = False
        if self.predict >= 0:
            out["predict"] = self.predict
        if self.segments:
            out["segments"] = [[g.group, g.first, g.count] for g in self.segments]
        if self.blocks:
            out["blocks"] = [[b, n, list(c), list(o)] for b, n, c, o in self.blocks]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlanOp:
        return cls(int(d["i"]), str(d["lane"]), tuple(int(x) for x in d["deps"]),
                   float(d.get("duration_s", 0.0)), str(d.get("kind", "")),
                   str(d.get("axis", "")), str(d.get("cid", "")), int(d.get("size_bytes", 0)),
                   int(d.get("wire_bytes", 0)),
                   tuple(Step.from_json(s) for s in d.get("steps", [])),
                   str(d.get("tag", "")), thread=str(d.get("thread", MAIN_THREAD)),
                   gated=bool(d.get("gated", True)), predict=int(d.get("predict", -1)),
                   segments=tuple(PlanSegment(str(g), int(a), int(n))
                                  for g, a, n in d.get("segments", [])),
                   blocks=tuple((int(b), int(n), tuple(int(x) for x in c),
                                 tuple(int(x) for x in o)) for b, n, c, o in d.get("blocks", [])))


@dataclass
class ReplayPlan:
    """Every rank's plan and the comm groups that Opus must know."""

    programs: dict[int, list[PlanOp]]
    groups: dict[str, CommGroup]
    scale: float
    lanes: dict[int, list[str]] = field(default_factory=dict)
    stages: dict[int, int] = field(default_factory=dict)  # rank -> pipeline stage (all ranks)
    electrical: bool = False  # rails are packet switches: no K-port budget to respect

    def job(self, job_id: str, ports: dict[int, RankPorts]) -> JobSpec:
        """The job for Opus, with the ranks' rail ports; refuses demands the ports can't carry
        (on optical rails)."""
        stages = ({r: self.stages[r] for r in ports} if self.stages and set(ports) <= set(
            self.stages) else None)
        try:
            return JobSpec(job_id, ports, self.groups, stages, check_ports=not self.electrical)
        except JobError as exc:
            short = port_shortfall(self, ports)
            raise PlanError(str(exc) if short is None else short.text()) from exc

    def calls_of(self, group_id: str) -> list[PlanOp]:
        """Every call (of any rank) that runs under ``group_id``, whole or as a segment."""
        return [op for ops in self.programs.values() for op in ops if op.is_call
                and any(s.group == group_id for s in op.call_segments)]


@dataclass(frozen=True)
class PortShortfall:
    """A comm group whose circuits need more ports at a rank than it owns on its rail: which
    group, rank and peers, the calls that use the group, and the K that carries every group
    of the job (the setting that fixes it)."""

    group: CommGroup
    rank: int
    rail: int
    peers: tuple[int, ...]
    owned: int
    calls: tuple[str, ...]  # "kind (tag)" of the calls that run under the group
    needed_k: int

    def text(self) -> str:
        g = self.group
        shape = ("a ring" if g.kind == "ring" and g.pairs is None else "pairs")
        uses = ", ".join(self.calls[:3]) + (f" and {len(self.calls) - 3} more"
                                              if len(self.calls) > 3 else "")
        peers = " and ".join(str(p) for p in self.peers)
        return (f"comm group {g.group_id} (axis {g.axis}, ranks "
                f"{' '.join(str(r) for r in g.ranks)}) runs {uses or 'no call'} as {shape} "
                f"on the rail, so rank {self.rank} needs {len(self.peers)} circuits on rail "
                f"{self.rail} at once (to ranks {peers}), but owns {self.owned} port(s) there "
                f"(ports per rank K={self.owned}). Fix: --ports-per-rank {self.needed_k} on "
                f"the command line or ocs.ports_per_rank: {self.needed_k} in the experiment "
                f"file (K={self.needed_k} carries every group of this job), mode: baseline "
                "(electrical rails), or a parallelism whose groups need fewer circuits per rank")


def port_shortfall(plan: ReplayPlan, ports: dict[int, RankPorts]) -> PortShortfall | None:
    """The first group (in the plan's order) that needs more circuits at a rank than the rank
    owns ports on its rail, with the K every group fits in; None when every group fits."""
    rail_of = {r: rp.rail for r, rp in ports.items()}
    first: tuple[CommGroup, int, int, tuple[int, ...]] | None = None
    needed = 1
    for g in plan.groups.values():
        try:
            demand = g.demand(rail_of)
        except (JobError, KeyError):
            continue  # not a port budget problem (JobSpec says what it is)
        for rail, edges in demand.items():
            peers: dict[int, set[int]] = {}
            for a, b in edges:
                peers.setdefault(a, set()).add(b)
                peers.setdefault(b, set()).add(a)
            for r, ps in sorted(peers.items()):
                needed = max(needed, len(ps))
                if first is None and r in ports and len(ps) > len(ports[r].ports):
                    first = (g, r, rail, tuple(sorted(ps)))
    if first is None:
        return None
    g, r, rail, peers_of_r = first
    calls = sorted({f"{op.kind} ({op.tag})" if op.tag else op.kind
                    for op in plan.calls_of(g.group_id)})
    return PortShortfall(g, r, rail, peers_of_r, len(ports[r].ports), tuple(calls), needed)


def scaled_bytes(size_bytes: int, scale: float) -> int:
    """Scaled size of a transfer; non-empty transfers keep at least one byte."""
    return 0 if size_bytes <= 0 else max(1, round(size_bytes * scale))


def pair_group_id(a: int, b: int) -> str:
    lo, hi = sorted((a, b))
    return f"p2p{lo}-{hi}"


def build_plan(schedule: Schedule, *, scale: float, rail_gbps: float = 200.0,
               latency_s: float = 5e-6, ranks: Iterable[int] | None = None,
               ports_per_rank: int = 1, electrical: bool = False,
               verify: bool = False) -> ReplayPlan:
    """Lower ``schedule`` to per-rank plans (see the module docstring): every rank, or ``ranks``.

    ``ports_per_rank`` (K) and ``electrical`` decide how segmented algorithms pack their
    rounds; ``verify`` adds the data blocks (tests).
    """
    return Planner(schedule, scale=scale, rail_gbps=rail_gbps, latency_s=latency_s,
                   ports_per_rank=ports_per_rank, electrical=electrical,
                   verify=verify).plan(ranks)


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
                 latency_s: float = 5e-6, ports_per_rank: int = 1, electrical: bool = False,
                 verify: bool = False) -> None:
        from workloads.timing import TimingModel  # numpy: the planner's, not the replayer's

        if not 0 < scale <= 1:
            raise PlanError(f"byte scale must be in (0, 1], got {scale}")
        self.schedule = schedule
        self.scale = scale
        self.ports_per_rank = ports_per_rank
        self.electrical = electrical
        self.verify = verify
        self._late = schedule.config.straggler_delay_s
        self._algorithms: dict[tuple[str, str], str] = {}  # (kind, group) -> algorithm
        self._lowered: dict[str, tuple[dict[int, tuple[tuple[Step, ...],
                                                       tuple[PlanSegment, ...]]],
                                       tuple[PlanBlock, ...]]] = {}
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
        return ReplayPlan(programs, self.groups(), self.scale, lanes, stages, self.electrical)

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
        algorithm = ALGORITHM[self.algorithm(op)]
        if algorithm.segmented:
            return gid  # its segments are groups of their own
        if gid not in self._groups:
            self._groups[gid] = CommGroup(gid, op.axis, self.schedule.group_ranks(gid), "ring")
        if algorithm.mesh:
            self._mesh_groups.add(gid)
        return gid

    def algorithm(self, op: Op) -> str:
        """The algorithm network op ``op`` runs."""
        key = (op.kind, op.group_id)
        if key not in self._algorithms:
            self._algorithms[key] = self.schedule.algorithm_of(op)
        return self._algorithms[key]

    def lower(self, rank: int) -> list[PlanOp]:
        """``rank``'s plan."""
        s = self.schedule
        program = int(s.program_of[rank])
        key = (program, (*self._shape(rank, program), rank in self._late))
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
        segments: tuple[PlanSegment, ...] = ()
        blocks: tuple[PlanBlock, ...] = ()
        if self.verify or self.algorithm(op) != DEFAULT_ALGORITHM[op.kind]:
            steps, segments, blocks = self._lowered_steps(lane, op)
        elif op.kind in P2P_KINDS:
            n = scaled_bytes(op.size_bytes, self.scale)
            steps = (Step(sends=((op.peer, n),)) if op.kind == "send"
                     else Step(recvs=((op.peer, n),)),)
        elif op.kind in RING_KINDS:
            steps = self._ring_steps(lane, op)
        else:
            steps = self._mesh_steps(lane, op)
        return PlanOp(index, lane, deps, kind=op.kind, axis=op.axis,
                      collective_id=op.collective_id, size_bytes=op.size_bytes,
                      wire_bytes=op.wire_bytes, steps=steps, tag=op.tag, thread=op.thread,
                      segments=segments, blocks=blocks)

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
        from workloads.timing import collective_duration_s

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
            if op.kind == "all_reduce" and rank in self._late:  # the straggler is late
                plan.append(PlanOp(len(plan), COMPUTE_LANE, deps, self._late[rank],
                                   tag=f"straggle.{op.tag}"))
                deps = (len(plan) - 1,)
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

    def _lowered_steps(self, lane: str, op: Op) -> tuple[
            tuple[Step, ...], tuple[PlanSegment, ...], tuple[PlanBlock, ...]]:
        """``op``'s rank's steps and segments from the whole collective's lowering (its
        algorithm, :mod:`workloads.algorithms`), and its blocks in verify plans."""
        entry = self._lowered.get(op.collective_id)
        if entry is None:
            plan = self.schedule.step_plan(op.collective_id, with_blocks=self.verify)
            sizes = {b.block_id: scaled_bytes(b.size_bytes, self.scale) for b in plan.blocks}
            per: dict[int, list[list[Any]]] = {r: [[[], [], [], []] for _ in plan.steps]
                                              for r in plan.ranks}
            for k, step in enumerate(plan.steps):
                for t in step:
                    self._same_rail(lane, t.src, t.dst)
                    n = self._scaled(t, sizes)
                    per[t.src][k][0].append((t.dst, n))
                    per[t.src][k][2].append(t.blocks)
                    per[t.dst][k][1].append((t.src, n))
                    per[t.dst][k][3].append(t.blocks)
            packed = self._segments(lane, op, plan)
            verify = self.verify
            entry = self._lowered[op.collective_id] = (
                {r: (tuple(Step(tuple(a), tuple(b), plan.is_sync(k),
                                tuple(c) if verify else (), tuple(d) if verify else ())
                           for k, (a, b, c, d) in enumerate(steps)),
                     tuple(PlanSegment(f"{lane}.{g.name}" if g.name else lane, g.first, g.count)
                           for g in packed if r in g.ranks))
                 for r, steps in per.items()},
                tuple((b.block_id, sizes[b.block_id], b.contributors, b.owners)
                      for b in plan.blocks))
        steps, segments = entry[0][op.rank]
        return steps, segments, entry[1]

    def _scaled(self, t: Transfer, block_sizes: dict[int, int]) -> int:
        """Scaled bytes of a transfer (of its blocks' scaled bytes when they are known)."""
        if t.blocks and block_sizes:
            return sum(block_sizes[b] for b, _ in t.blocks)
        return scaled_bytes(t.size_bytes, self.scale)

    def _segments(self, lane: str, op: Op, plan: StepPlan) -> tuple[Segment, ...]:
        """The plan's units packed into segments for K ports (one on electrical rails), each
        registered as a comm group; none when the lane's group serves the whole call."""
        units = plan.units
        if not units or (len(units) == 1 and units[0].pairs is None):
            return ()
        segments = pack_segments(units, None if self.electrical else self.ports_per_rank)
        for g in segments:
            gid = f"{lane}.{g.name}"
            group = CommGroup(gid, op.axis, g.ranks, "pairs", g.pairs)
            if self._groups.setdefault(gid, group) != group:
                raise PlanError(f"group {gid}: two collectives of {lane} need different "
                                "circuits under one segment name")
        return segments

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
