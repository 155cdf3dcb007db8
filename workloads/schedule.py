"""The schedule of one training iteration: per-rank op lists, comm groups, step plans, phases.

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
  of :mod:`workloads.steps`); their duration is for the network to decide.
* ``scale_up`` is True when all members share a server: the traffic stays on NVLink and
  needs no rail circuit, so replayers and the controller skip the network.
* ``thread`` is the host thread that issues the op in PyTorch: ``main`` (the training loop,
  forward, pipeline sends/receives, the step-end gradient reduction) or ``autograd`` (FSDP's
  pre-backward all-gathers, issued from the backward pass). It changes no timing; it tells
  which calls a framework hooked on the main thread sees (the artifact's request points).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from workloads.config import WorkloadConfig
from workloads.hardware import Cluster
from workloads.layout import (
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
from workloads.steps import P2P_KINDS, StepPlan, lower, wire_bytes

if TYPE_CHECKING:
    from workloads.phases import Phase

#: Host threads that issue ops (:attr:`TemplateOp.thread`).
MAIN_THREAD = "main"
AUTOGRAD_THREAD = "autograd"
THREADS = (MAIN_THREAD, AUTOGRAD_THREAD)


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
        return Op(rank, index, t.kind, t.tag, t.deps, axis=t.axis, group_id=gid,
                  collective_id=f"{gid}:{t.tag}", size_bytes=t.size_bytes,
                  wire_bytes=wire_bytes(t.kind, n, pos, t.size_bytes, t.split),
                  scale_up=bool(self.group_scale_up(t.axis)[g]), thread=t.thread)

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

    def step_plan(self, collective_id: str) -> StepPlan:
        """The collective lowered to per-step transfers (see :mod:`workloads.steps`)."""
        members = self.collective_members(collective_id)
        kind = members[0].kind
        if kind in P2P_KINDS:
            send = next(m for m in members if m.kind == "send")
            return lower(collective_id, "send", (send.rank, send.peer), [send.size_bytes])
        splits = None
        if kind == "all_to_all":
            splits = [self.program(m.rank).ops[m.index].split for m in members]
        return lower(collective_id, kind, tuple(m.rank for m in members),
                     [m.size_bytes for m in members], splits)

    def op_circuits(self, op: Op) -> Circuits:
        """Rail circuits a collective op needs (unordered rank pairs per rail)."""
        if op.scale_up or not op.is_collective:
            return {}
        if op.kind in P2P_KINDS:
            return pair_circuits([(op.rank, op.peer)], self.cluster)
        ranks = self.group_ranks(op.group_id)
        if op.kind == "all_to_all":
            return mesh_circuits(ranks, self.cluster)
        return ring_circuits(ranks, self.cluster)

    def phases_of(self, rank: int, include_scale_up: bool = False) -> list[Phase]:
        """Phases of ``rank`` (see :mod:`workloads.phases`)."""
        from workloads.phases import phases_of

        return phases_of(self, rank, include_scale_up)

    # --- persistence -------------------------------------------------------------------
    def to_json(self, path: str) -> None:
        """Write the documented JSON form (``workloads/FORMAT.md``)."""
        from workloads.serialize import dump

        dump(self, path)

    @classmethod
    def from_json(cls, path: str) -> Schedule:
        from workloads.serialize import load

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
