"""The schedule of one training iteration: per-rank op lists, comm groups, step plans, and its
JSON form (``workloads/FORMAT.md``: :func:`dump`, :func:`load`). Phases, which are derived
from a schedule, are :func:`workloads.phases.phases_of`.

Compact form. Ranks on the same pipeline stage (and, with an uneven expert split, the same EP
position) run the same *program*: the same ops with the same sizes, bound to their own comm
groups. A :class:`Schedule` therefore stores one :class:`Program` per distinct role, the map
``program_of[rank]`` and the groups of each axis as integer arrays; :meth:`Schedule.ops_of`
materialises the concrete :class:`Op` list of any rank on demand. Step plans, phases and
circuits are computed lazily as well, so a 16k-GPU schedule costs a few MB.

Op semantics (shared by the replayer, the simulator and the controller's tests):

* ``ops_of(rank)[i].index == i``; list order is the order the framework issues the ops and
  is a topological order of the per-rank DAG.
* An op may start once every op in ``deps`` (indices into the same rank's list) has
  completed; ops with no path between them may run concurrently (different CUDA streams).
* A collective starts when all its members have reached it (the slowest rank joins last);
  its members are the ops sharing ``collective_id = f"{group_id}:{tag}"``. For send/recv the
  two ops sharing the id are the sender and the receiver.
* Compute ops carry ``duration_s``; collectives carry ``size_bytes`` (the input tensor, as
  PyTorch's profiler reports it) and ``wire_bytes`` (what this rank sends with the algorithm
  the configuration chose, :mod:`workloads.algorithms`); their duration is for the network to
  decide.
* ``scale_up`` is True when all members share a server: the traffic stays on NVLink and
  needs no rail circuit, so replayers and the controller skip the network.
* ``thread`` is the host thread that issues the op in PyTorch: ``main`` (the training loop,
  forward, pipeline sends/receives, the step-end gradient reduction) or ``autograd`` (FSDP's
  pre-backward all-gathers, issued from the backward pass). It changes no timing; it tells
  which calls a framework hooked on the main thread sees (the artifact's request points).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from workloads.algorithms import ALGORITHM, DEFAULT_ALGORITHM, lower_positions
from workloads.algorithms import lower as lower_with
from workloads.config import Straggler, WorkloadConfig
from workloads.errors import WorkloadConfigError
from workloads.hardware import Cluster, GpuSpec
from workloads.layout import (
    AXES,
    AXIS_FAMILY,
    Circuits,
    GroupSet,
    RankIndex,
    index_groups,
    mesh_circuits,
    pair_circuits,
    ring_circuits,
    scale_up_mask,
)
from workloads.models import ModelSpec
from workloads.parallel import ParallelConfig
from workloads.steps import P2P_KINDS, StepPlan, lower, wire_bytes
from workloads.threads import MAIN_THREAD, THREADS


@dataclass(frozen=True)
class TemplateOp:
    """One op of a program, before it is bound to a rank's groups.

    ``tag`` names the op uniquely within its program and identically on every member of a
    collective. ``split`` is, for all-to-all, the bytes sent to each group position.
    ``peer_stage`` is the pipeline stage of the other end of a send/recv. ``thread`` is the
    host thread that issues the op: ``main``, or ``autograd`` for what the backward pass issues
    from autograd's own thread (FSDP's backward all-gathers); the rail-state request points
    (:mod:`testbed.plan.requestpoints`) follow the main thread's issue order only.
    """

    kind: str
    tag: str
    deps: tuple[int, ...] = ()
    duration_s: float = 0.0
    axis: str = ""
    size_bytes: int = 0
    peer_stage: int = -1
    split: tuple[int, ...] = ()
    thread: str = MAIN_THREAD

    @property
    def is_collective(self) -> bool:
        return self.kind != "compute"


@dataclass(frozen=True)
class Program:
    """The op list shared by all ranks of one role (pipeline stage, EP position)."""

    stage: int
    ep_index: int
    ops: tuple[TemplateOp, ...]

    @cached_property
    def tag_index(self) -> dict[str, int]:
        return {op.tag: i for i, op in enumerate(self.ops)}

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Program) and self.stage == other.stage
                and self.ep_index == other.ep_index and self.ops == other.ops)

    def __hash__(self) -> int:
        return hash((self.stage, self.ep_index, len(self.ops)))


@dataclass(frozen=True)
class Op:
    """One op of one rank, bound to its comm group."""

    rank: int
    index: int
    kind: str
    tag: str
    deps: tuple[int, ...]
    duration_s: float = 0.0
    axis: str = ""
    group_id: str = ""
    collective_id: str = ""
    size_bytes: int = 0
    wire_bytes: int = 0
    peer: int = -1
    scale_up: bool = False
    thread: str = MAIN_THREAD

    @property
    def is_collective(self) -> bool:
        return self.kind != "compute"

    @property
    def family(self) -> str:
        """Paper-level axis (dp, pp, tp, cp, ep) of a collective."""
        return AXIS_FAMILY.get(self.axis, self.axis)


@dataclass(eq=False)
class Schedule:
    """One training iteration for every rank, in compact form (see the module docstring)."""

    config: WorkloadConfig
    groups: dict[str, GroupSet]
    programs: list[Program]
    program_of: np.ndarray  # (world_size,) program index of every rank
    origin: dict[str, Any] | None = None  # provenance of a captured/imported schedule
    _index: dict[str, RankIndex] = field(default_factory=dict, repr=False)
    _scale_up: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _lowered: dict[tuple[str, str], tuple[StepPlan, int | None, list[int]]] = field(
        default_factory=dict, repr=False)

    # --- placement ---------------------------------------------------------------------
    @property
    def cluster(self) -> Cluster:
        return self.config.cluster

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    def server_of(self, rank: int) -> int:
        return self.cluster.server_of(rank)

    def rail_of(self, rank: int) -> int:
        return self.cluster.rail_of(rank)

    def stage_of(self, rank: int) -> int:
        return rank // (self.world_size // self.config.parallel.pp)

    # --- groups ------------------------------------------------------------------------
    def rank_index(self, axis: str) -> RankIndex:
        if axis not in self._index:
            self._index[axis] = index_groups(self.groups[axis], self.world_size)
        return self._index[axis]

    def group_scale_up(self, axis: str) -> np.ndarray:
        if axis not in self._scale_up:
            self._scale_up[axis] = scale_up_mask(self.groups[axis], self.cluster)
        return self._scale_up[axis]

    def group_of(self, rank: int, axis: str) -> str:
        """Id of ``rank``'s group on ``axis``."""
        return f"{axis}{int(self.rank_index(axis).group[rank])}"

    def group_ranks(self, group_id: str) -> tuple[int, ...]:
        """Ranks of a group in ring order."""
        axis, index = _split_group_id(group_id)
        return tuple(int(r) for r in self.groups[axis].ranks[index])

    def peer_rank(self, rank: int, stage: int) -> int:
        """The rank at pipeline stage ``stage`` with the same other coordinates as ``rank``."""
        per_stage = self.world_size // self.config.parallel.pp
        return rank % per_stage + stage * per_stage

    # --- ops ---------------------------------------------------------------------------
    def program(self, rank: int) -> Program:
        return self.programs[int(self.program_of[rank])]

    @property
    def op_count(self) -> int:
        """Total ops over all ranks (counted without materialising them)."""
        lengths = np.array([len(p.ops) for p in self.programs], dtype=np.int64)
        return int(lengths[self.program_of].sum())

    def ops_of(self, rank: int) -> list[Op]:
        """The concrete ops of ``rank`` in issue order."""
        prog = self.program(rank)
        out: list[Op] = []
        for i, t in enumerate(prog.ops):
            out.append(self._bind(rank, i, t))
        return out

    def op(self, rank: int, index: int) -> Op:
        return self._bind(rank, index, self.program(rank).ops[index])

    def _bind(self, rank: int, index: int, t: TemplateOp) -> Op:
        if t.kind == "compute":
            return Op(rank, index, t.kind, t.tag, t.deps, duration_s=t.duration_s,
                      thread=t.thread)
        ri = self.rank_index(t.axis)
        g = int(ri.group[rank])
        gid = f"{t.axis}{g}"
        if t.kind in P2P_KINDS:
            peer = self.peer_rank(rank, t.peer_stage)
            same = self.server_of(peer) == self.server_of(rank)
            wire = wire_bytes(t.kind, 2, 0, t.size_bytes)
            return Op(rank, index, t.kind, t.tag, t.deps, axis=t.axis, group_id=gid,
                      collective_id=f"{gid}:{t.tag}", size_bytes=t.size_bytes,
                      wire_bytes=wire, peer=peer, scale_up=same, thread=t.thread)
        n = self.groups[t.axis].size
        pos = int(ri.position[rank])
        if self.config.algorithm_for(t.kind, t.axis) == DEFAULT_ALGORITHM[t.kind]:
            wire = wire_bytes(t.kind, n, pos, t.size_bytes, t.split)
        else:
            wire = self._positional(gid, t.tag)[2][pos]
        return Op(rank, index, t.kind, t.tag, t.deps, axis=t.axis, group_id=gid,
                  collective_id=f"{gid}:{t.tag}", size_bytes=t.size_bytes, wire_bytes=wire,
                  scale_up=bool(self.group_scale_up(t.axis)[g]), thread=t.thread)

    # --- algorithms --------------------------------------------------------------------
    def algorithm_of(self, op: Op) -> str:
        """The algorithm collective ``op`` runs (:mod:`workloads.algorithms`)."""
        chosen = self.config.algorithm_for(op.kind, op.axis)
        if chosen == DEFAULT_ALGORITHM.get(op.kind, chosen) or op.kind in P2P_KINDS:
            return chosen
        return ALGORITHM[chosen].runs_as(self.groups[op.axis].size,
                                         self.straggler_position(op.group_id) is not None).name

    def straggler_position(self, group_id: str) -> int | None:
        """Ring position of the group's straggler (``workload.stragglers``), if it has one."""
        late = self.config.straggler_delay_s
        if not late:
            return None
        ranks = self.group_ranks(group_id)
        return next((i for i, r in enumerate(ranks) if r in late), None)

    def _positional(self, group_id: str, tag: str) -> tuple[StepPlan, int | None, list[int]]:
        """The collective ``group_id:tag`` lowered over positions ``0..n-1`` with its
        algorithm (shared by the groups of one shape), its straggler's position and the bytes
        each position sends."""
        key = (group_id, tag)
        if key not in self._lowered:
            ranks = self.group_ranks(group_id)
            tops = [self.program(r).ops[self.program(r).tag_index[tag]] for r in ranks]
            kind, axis = tops[0].kind, tops[0].axis
            where = self.straggler_position(group_id)
            splits = tuple(t.split for t in tops) if kind == "all_to_all" else None
            plan = lower_positions(kind, self.config.algorithm_for(kind, axis), len(ranks),
                                   tuple(t.size_bytes for t in tops), splits, where)
            sent = [0] * len(ranks)
            for step in plan.steps:
                for x in step:
                    sent[x.src] += x.size_bytes
            self._lowered[key] = (plan, where, sent)
        return self._lowered[key]

    # --- collectives -------------------------------------------------------------------
    def collective_members(self, collective_id: str) -> list[Op]:
        """The ops, one per participating rank, that form one collective."""
        group_id, tag = collective_id.split(":", 1)
        out = []
        for r in self.group_ranks(group_id):
            idx = self.program(r).tag_index.get(tag)
            if idx is not None:
                out.append(self.op(r, idx))
        if not out:
            raise KeyError(f"no collective {collective_id!r}")
        return out

    def step_plan(self, collective_id: str, with_blocks: bool = False) -> StepPlan:
        """The collective lowered to per-step transfers with its algorithm
        (:mod:`workloads.algorithms`); ``with_blocks`` adds its data semantics."""
        members = self.collective_members(collective_id)
        kind = members[0].kind
        if kind in P2P_KINDS:
            send = next(m for m in members if m.kind == "send")
            if not with_blocks:
                return lower(collective_id, "send", (send.rank, send.peer), [send.size_bytes])
            return lower_with(collective_id, "send", "pairwise", (send.rank, send.peer),
                              [send.size_bytes], with_blocks=True)
        splits = None
        if kind == "all_to_all":
            splits = [self.program(m.rank).ops[m.index].split for m in members]
        ranks = tuple(m.rank for m in members)
        where = self.straggler_position(members[0].group_id)
        return lower_with(collective_id, kind, self.algorithm_of(members[0]), ranks,
                          [m.size_bytes for m in members], splits,
                          straggler=None if where is None else ranks[where],
                          with_blocks=with_blocks)

    def op_circuits(self, op: Op) -> Circuits:
        """Rail circuits a collective op needs (unordered rank pairs per rail)."""
        if op.scale_up or not op.is_collective:
            return {}
        if op.kind in P2P_KINDS:
            return pair_circuits([(op.rank, op.peer)], self.cluster)
        ranks = self.group_ranks(op.group_id)
        if ALGORITHM[self.algorithm_of(op)].mesh:
            return mesh_circuits(ranks, self.cluster)
        return ring_circuits(ranks, self.cluster)

    # --- persistence -------------------------------------------------------------------
    def to_json(self, path: str) -> None:
        """Write the documented JSON form (``workloads/FORMAT.md``)."""
        dump(self, path)

    @classmethod
    def from_json(cls, path: str) -> Schedule:
        """The schedule in the file at ``path`` (:func:`load`)."""
        return load(path)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Schedule) and self.config == other.config
                and self.groups == other.groups and self.programs == other.programs
                and np.array_equal(self.program_of, other.program_of))

    __hash__ = None  # type: ignore[assignment]


def _split_group_id(group_id: str) -> tuple[str, int]:
    axis = group_id.rstrip("0123456789")
    if not axis or axis == group_id:
        raise KeyError(f"bad group id {group_id!r}")
    return axis, int(group_id[len(axis):])


# --- the JSON form (``workloads/FORMAT.md``) ---------------------------------------------
# Programs are stored column-wise (one list per op field) to keep 16k-rank schedules small; a
# load of a dump compares equal to the original.

FORMAT = "opus-testbed/workload-schedule"
VERSION = 1
OP_COLUMNS = ("kind", "tag", "deps", "duration_s", "axis", "size_bytes", "peer_stage", "split")
#: Optional columns, written only when some op differs from the default.
OPTIONAL_COLUMNS = {"thread": MAIN_THREAD}
#: Config fields written only when not at their defaults, so older schedules serialise as before.
OPTIONAL_CONFIG_FIELDS = {"activation_checkpointing": "none", "loss_logging_allreduces": 0,
                          "calibrate_step_s": None, "compute_scale": 1.0,
                          "algorithms": (), "stragglers": ()}
#: The same for the fields of ``model`` (multi-head latent attention) and ``parallel``.
OPTIONAL_MODEL_FIELDS = {"kv_lora_rank": 0, "q_lora_rank": 0, "qk_rope_head_dim": 0,
                         "v_head_dim": 0}
OPTIONAL_PARALLEL_FIELDS = {"pp_layer_split": "even"}


def _drop_defaults(d: dict[str, Any], defaults: dict[str, Any]) -> None:
    for key, default in defaults.items():
        if d[key] == default:
            del d[key]


def config_to_dict(cfg: WorkloadConfig) -> dict[str, Any]:
    d = asdict(cfg)
    _drop_defaults(d, OPTIONAL_CONFIG_FIELDS)
    if d["model"] is not None:
        _drop_defaults(d["model"], OPTIONAL_MODEL_FIELDS)
    _drop_defaults(d["parallel"], OPTIONAL_PARALLEL_FIELDS)
    return d


def config_from_dict(d: dict[str, Any]) -> WorkloadConfig:
    rest = {k: v for k, v in d.items() if k not in ("model", "cluster", "parallel", "gpu",
                                                    "algorithms", "stragglers")}
    model = None if d["model"] is None else ModelSpec(**d["model"])
    return WorkloadConfig(model=model, cluster=Cluster(**d["cluster"]),
                          parallel=ParallelConfig(**d["parallel"]), gpu=GpuSpec(**d["gpu"]),
                          algorithms=tuple(tuple(a) for a in d.get("algorithms", ())),
                          stragglers=tuple(Straggler(**s) for s in d.get("stragglers", ())),
                          **rest)


def program_to_dict(p: Program) -> dict[str, Any]:
    names = OP_COLUMNS + tuple(c for c, default in OPTIONAL_COLUMNS.items()
                               if any(getattr(op, c) != default for op in p.ops))
    cols: dict[str, list[Any]] = {c: [] for c in names}
    for op in p.ops:
        for c in names:
            v = getattr(op, c)
            cols[c].append(list(v) if isinstance(v, tuple) else v)
    return {"stage": p.stage, "ep_index": p.ep_index, "ops": cols}


def program_from_dict(d: dict[str, Any]) -> Program:
    cols = d["ops"]
    n = len(cols["kind"])
    threads = cols.get("thread", [MAIN_THREAD] * n)
    bad = sorted({t for t in threads if t not in THREADS})
    if bad:
        raise WorkloadConfigError(f"unknown threads {bad}; known: {', '.join(THREADS)}",
                                  "programs.ops.thread")
    ops = tuple(
        TemplateOp(kind=cols["kind"][i], tag=cols["tag"][i], deps=tuple(cols["deps"][i]),
                   duration_s=float(cols["duration_s"][i]), axis=cols["axis"][i],
                   size_bytes=int(cols["size_bytes"][i]), peer_stage=int(cols["peer_stage"][i]),
                   split=tuple(cols["split"][i]), thread=str(threads[i]))
        for i in range(n))
    return Program(int(d["stage"]), int(d["ep_index"]), ops)


def to_dict(s: Schedule) -> dict[str, Any]:
    out: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    if s.origin is not None:
        out["origin"] = s.origin
    out.update({
        "config": config_to_dict(s.config),
        "groups": {axis: s.groups[axis].ranks.tolist() for axis in AXES},
        "programs": [program_to_dict(p) for p in s.programs],
        "program_of_rank": s.program_of.tolist(),
    })
    return out


def from_dict(d: dict[str, Any]) -> Schedule:
    if d.get("format") != FORMAT or d.get("version") != VERSION:
        raise WorkloadConfigError(
            f"not a version-{VERSION} {FORMAT} document", "format")
    cfg = config_from_dict(d["config"])
    groups = {axis: GroupSet(axis, np.asarray(d["groups"][axis], dtype=np.int64).reshape(
        -1, len(d["groups"][axis][0]) if d["groups"][axis] else 1)) for axis in AXES}
    programs = [program_from_dict(p) for p in d["programs"]]
    program_of = np.asarray(d["program_of_rank"], dtype=np.int32)
    if program_of.shape != (cfg.cluster.world_size,):
        raise WorkloadConfigError("needs one entry per rank", "program_of_rank")
    _check_programs(programs)
    return Schedule(cfg, groups, programs, program_of, origin=d.get("origin"))


def _check_programs(programs: list[Program]) -> None:
    for pi, p in enumerate(programs):
        for i, op in enumerate(p.ops):
            if any(not 0 <= dep < i for dep in op.deps):
                raise WorkloadConfigError(
                    f"op {i} ({op.tag}) depends on a later or missing op",
                    f"programs[{pi}].ops.deps")


def dump(s: Schedule, path: str | Path) -> None:
    with open(path, "w") as fh:
        json.dump(to_dict(s), fh, separators=(",", ":"))


def load(path: str | Path) -> Schedule:
    """The schedule in the file at ``path``; :class:`WorkloadConfigError` names the file."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except OSError as exc:
        raise WorkloadConfigError(f"cannot read it: {exc.strerror}", "", str(path)) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"{path}:{exc.lineno}:{exc.colno}" if isinstance(
            exc, json.JSONDecodeError) else str(path)
        raise WorkloadConfigError(f"not JSON: {exc}", "", where) from exc
    try:
        return from_dict(data)
    except WorkloadConfigError as exc:
        raise WorkloadConfigError(exc.reason, exc.field, str(path)) from exc
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WorkloadConfigError(f"not a valid schedule ({type(exc).__name__}: {exc})", "",
                                  str(path)) from exc
