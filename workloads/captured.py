"""Schedules from real runs: each rank's observed collective calls -> a :class:`Schedule`.

The torch capture (:mod:`testbed.torchjob.capture`, the backend's call records) and the Kineto
importer (:mod:`workloads.kineto`, ``torch.profiler`` traces) both observe, per rank, the
collectives it issued in one training iteration, in issue order, and when its main thread was
blocked waiting for them. This module turns such observations into the schedule format of
``workloads/FORMAT.md``, so a captured run replays like a generated one.

Rules (pure; every refusal raises :class:`CaptureError` naming the call's source):

* **Groups.** The members of the calls (global ranks in group order = ring order), per axis.
  Each axis's groups must have one size and cover every rank exactly once, as a device mesh's
  do; axes nobody used get singleton groups. ``parallel`` holds each axis's group size. Send
  and recv must run on a ``pp`` group laid out stage-major (rank ``r`` at stage
  ``r // (world / pp)``), which is what :meth:`Schedule.peer_rank` assumes.
* **Ops of a rank.** Its main thread's timeline from the iteration's start to its end: a
  *compute* op covers the time between consecutive events (call issues, waits) that the thread
  was not blocked in a wait (``busy_s`` overrides the measure, e.g. GPU kernel time); a
  collective depends on the compute before its issue (and on calls waited for since); the
  compute after a wait depends on the waited call. Calls never waited for only end the
  iteration. One program per rank (``program_of_rank`` = identity; equal programs are shared).
* **Tags.** The ``k``-th call of a rank on group ``<axis><g>`` is ``<axis><g>.c<k>`` on every
  member; the ``n``-th send from ``a`` to ``b`` and the ``n``-th recv of ``b`` from ``a`` are
  ``pp.<a>><b>.<n>``. Members must agree on the count, the kind and the size of each call
  (but for all-gather and all-to-all, whose members may contribute different sizes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workloads.config import WorkloadConfig
from workloads.hardware import Cluster
from workloads.layout import AXES, GroupSet
from workloads.parallel import ParallelConfig
from workloads.schedule import Program, Schedule, TemplateOp
from workloads.steps import P2P_KINDS
from workloads.timing import DeadlockError, simulate

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "send", "recv", "all_to_all")
MIN_COMPUTE_S = 1e-6  # shorter main-thread gaps are not worth an op
#: torch process-group descriptors (DeviceMesh names them ``mesh_<dim>``) -> schedule axis
DESC_AXES = {"pp": "pp", "fsdp": "fsdp", "shard": "fsdp", "dp_shard": "fsdp",
             "dp": "dp", "replicate": "dp", "dp_replicate": "dp", "tp": "tp", "cp": "cp",
             "ep": "ep", "edp": "edp"}


class CaptureError(ValueError):
    """An observation that cannot become a schedule; the message names where it came from."""


def axis_of_desc(desc: str, overrides: dict[str, str] | None = None) -> str | None:
    """The schedule axis of a torch group descriptor (``mesh_fsdp`` -> ``fsdp``), or None."""
    if overrides and desc in overrides:
        return overrides[desc]
    return DESC_AXES.get(desc.removeprefix("mesh_"))


@dataclass(frozen=True)
class Call:
    """One collective call of one rank, as observed.

    ``members`` are the global ranks of its group in group order; ``peer`` the global rank at
    the other end of a send/recv; ``split`` the bytes an all-to-all sends to each position;
    ``wait`` the (start, end) in seconds during which the rank's main thread was blocked
    waiting for it, if it was; ``source`` says where it was observed, for error messages.
    """

    kind: str
    axis: str
    members: tuple[int, ...]
    size_bytes: int
    t_issue_s: float
    peer: int = -1
    split: tuple[int, ...] = ()
    wait: tuple[float, float] | None = None
    source: str = ""


@dataclass
class RankRun:
    """One rank's observed iteration: its calls in issue order and the iteration's bounds.

    ``busy_s(t0, t1)``, when given, is the compute time between two main-thread events (for
    example the GPU kernels launched then); otherwise it is the unblocked wall time.
    """

    rank: int
    calls: list[Call]
    t_start_s: float
    t_end_s: float
    busy_s: Callable[[float, float], float] | None = None


def schedule_from_runs(runs: dict[int, RankRun], *, gpus_per_server: int,
                       origin: dict[str, Any]) -> Schedule:
    """The schedule of one observed iteration of every rank (see the module docstring)."""
    world = len(runs)
    if sorted(runs) != list(range(world)):
        missing = sorted(set(range(max(runs, default=-1) + 1)) - set(runs))
        raise CaptureError(f"ranks {missing} are missing: every rank 0..N-1 needs its record")
    if gpus_per_server < 1 or world % gpus_per_server:
        raise CaptureError(f"{world} ranks do not fill servers of {gpus_per_server} GPUs "
                           "(--gpus-per-server)")
    for run in runs.values():
        for call in run.calls:
            _check_call(run.rank, call)
    groups = _group_sets(runs, world)
    sizes = {axis: groups[axis].size for axis in AXES}
    per_stage = world // sizes["pp"]
    _check_stage_major(groups["pp"], per_stage, runs)
    parallel = ParallelConfig(tp=sizes["tp"], dp=sizes["dp"], fsdp=sizes["fsdp"],
                              pp=sizes["pp"], cp=sizes["cp"], ep=sizes["ep"])
    config = WorkloadConfig(model=None, cluster=Cluster(world // gpus_per_server,
                                                        gpus_per_server), parallel=parallel)
    tags = _tags(runs, groups)
    programs: list[Program] = []
    index: dict[Program, int] = {}
    program_of = np.zeros(world, dtype=np.int32)
    for rank in range(world):
        ops = _rank_ops(runs[rank], tags[rank], per_stage)
        prog = Program(rank // per_stage, 0, tuple(ops))
        program_of[rank] = index.setdefault(prog, len(programs))
        if program_of[rank] == len(programs):
            programs.append(prog)
    schedule = Schedule(config, groups, programs, program_of, origin=origin)
    try:
        simulate(schedule)
    except DeadlockError as exc:
        raise CaptureError(f"the observed calls cannot all complete in this order: {exc}"
                           ) from exc
    return schedule


def _check_call(rank: int, c: Call) -> None:
    where = c.source or f"rank {rank}"
    if c.kind not in KINDS:
        raise CaptureError(f"{where}: collective kind {c.kind!r} is not one of {KINDS}")
    if c.axis not in AXES:
        raise CaptureError(f"{where}: {c.kind} on group {list(c.members)} has axis {c.axis!r}, "
                           f"not one of {AXES}")
    if rank not in c.members:
        raise CaptureError(f"{where}: rank {rank} is not a member of its group "
                           f"{list(c.members)}")
    if c.kind in P2P_KINDS:
        if c.axis != "pp":
            raise CaptureError(f"{where}: {c.kind} on a {c.axis} group {list(c.members)}; the "
                               "schedule format carries send/recv between pipeline stages only")
        if c.peer not in c.members or c.peer == rank:
            raise CaptureError(f"{where}: {c.kind} peer {c.peer} is not another member of "
                               f"{list(c.members)}")
    if c.kind == "all_to_all" and c.split and len(c.split) != len(c.members):
        raise CaptureError(f"{where}: all_to_all split {list(c.split)} does not have one "
                           f"entry per member of {list(c.members)}")


def _group_sets(runs: dict[int, RankRun], world: int) -> dict[str, GroupSet]:
    seen: dict[str, dict[tuple[int, ...], str]] = defaultdict(dict)
    for run in runs.values():
        for c in run.calls:
            seen[c.axis].setdefault(c.members, c.source or f"rank {run.rank}")
    out = {}
    for axis in AXES:
        found = seen.get(axis)
        if not found:
            out[axis] = GroupSet(axis, np.arange(world, dtype=np.int64).reshape(-1, 1))
            continue
        ordered = sorted(found, key=min)
        size = len(ordered[0])
        owner: dict[int, tuple[int, ...]] = {}
        for members in ordered:
            if len(members) != size:
                raise CaptureError(
                    f"{found[members]}: {axis} groups differ in size ({list(ordered[0])} and "
                    f"{list(members)}); the schedule format needs one size per axis")
            for r in members:
                if r in owner and owner[r] != members:
                    raise CaptureError(
                        f"{found[members]}: rank {r} is in two {axis} groups, "
                        f"{list(owner[r])} and {list(members)}")
                owner[r] = members
        if len(owner) != world:
            lone = sorted(set(range(world)) - set(owner))
            raise CaptureError(f"{found[ordered[0]]}: {axis} groups {[list(g) for g in ordered]} "
                               f"leave ranks {lone} out; every rank needs a group per axis")
        out[axis] = GroupSet(axis, np.asarray(ordered, dtype=np.int64))
    return out


def _check_stage_major(pp: GroupSet, per_stage: int, runs: dict[int, RankRun]) -> None:
    for members in pp.ranks.tolist():
        if members != [members[0] + s * per_stage for s in range(len(members))]:
            src = next((c.source for run in runs.values() for c in run.calls
                        if list(c.members) == members), "")
            raise CaptureError(f"{src}: pp group {members} is not stage-major (stage s at rank "
                               f"s * {per_stage} + offset), which the schedule format needs")


def _tags(runs: dict[int, RankRun], groups: dict[str, GroupSet]) -> dict[int, list[str]]:
    """The tag of every call of every rank, after checking that members agree on them."""
    gid = {axis: {tuple(int(r) for r in row): f"{axis}{g}"
                  for g, row in enumerate(gs.ranks.tolist())} for axis, gs in groups.items()}
    out: dict[int, list[str]] = {}
    seen: dict[str, dict[int, list[Call]]] = defaultdict(lambda: defaultdict(list))
    for rank, run in runs.items():
        counts: dict[tuple[str, ...], int] = defaultdict(int)
        tags = []
        for c in run.calls:
            if c.kind in P2P_KINDS:
                src, dst = (rank, c.peer) if c.kind == "send" else (c.peer, rank)
                key: tuple[str, ...] = ("p2p", str(src), str(dst), c.kind)
                tag = f"pp.{src}>{dst}.{counts[key]}"
                seen[f"pp.{src}>{dst}"][rank].append(c)
            else:
                key = (gid[c.axis][c.members],)
                tag = f"{key[0]}.c{counts[key]}"
                seen[key[0]][rank].append(c)
            counts[key] += 1
            tags.append(tag)
        out[rank] = tags
    for name, by_rank in seen.items():
        _check_agreement(name, by_rank)
    return out


def _check_agreement(name: str, by_rank: dict[int, list[Call]]) -> None:
    """Every member of group (or sender/receiver pair) ``name`` saw the same calls."""
    if name.startswith("pp.") and ">" in name:
        src, dst = (int(x) for x in name[3:].split(">"))
        lists = {src: [c for c in by_rank.get(src, []) if c.kind == "send"],
                 dst: [c for c in by_rank.get(dst, []) if c.kind == "recv"]}
    else:
        members = next(iter(by_rank.values()))[0].members
        lists = {r: by_rank.get(r, []) for r in members}
    (ra, a), *rest = lists.items()
    for rb, b in rest:
        if len(a) != len(b):
            rl, cl = (ra, a) if len(a) > len(b) else (rb, b)
            extra = cl[min(len(a), len(b))]
            raise CaptureError(
                f"{extra.source or f'rank {rl}'}: {name}: rank {ra} has {len(a)} calls in the "
                f"iteration, rank {rb} has {len(b)}; the first unmatched is this {extra.kind} "
                f"of {extra.size_bytes} B")
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            same_kind = x.kind == y.kind or {x.kind, y.kind} == {"send", "recv"}
            same_size = x.size_bytes == y.size_bytes or x.kind in ("all_gather", "all_to_all")
            if not (same_kind and same_size):
                raise CaptureError(
                    f"{y.source or f'rank {rb}'}: {name} call {k}: {y.kind} of {y.size_bytes} B "
                    f"on rank {rb}, but {x.kind} of {x.size_bytes} B on rank {ra} "
                    f"({x.source or f'rank {ra}'})")


def _rank_ops(run: RankRun, tags: Sequence[str], per_stage: int) -> list[TemplateOp]:
    """The ops of one rank from its main-thread timeline (see the module docstring)."""
    events: list[tuple[float, int, int]] = []  # (time, 0 issue | 1 wait, call index)
    for i, c in enumerate(run.calls):
        events.append((c.t_issue_s, 0, i))
        if c.wait is not None:
            events.append((max(c.wait[0], c.t_issue_s), 1, i))
    events.sort()
    ops: list[TemplateOp] = []
    op_of_call: dict[int, int] = {}
    pending: list[int] = []  # what the main thread has passed since its last compute op
    cursor = run.t_start_s

    def compute(until: float) -> None:
        nonlocal pending, cursor
        if until <= cursor:
            return
        dur = run.busy_s(cursor, until) if run.busy_s else until - cursor
        cursor = until
        if dur >= MIN_COMPUTE_S:
            ops.append(TemplateOp("compute", f"compute.{len(ops)}", _deps(pending),
                                  duration_s=dur))
            pending = [len(ops) - 1]

    for t, what, i in events:
        c = run.calls[i]
        compute(t)
        if what == 0:
            peer_stage = c.peer // per_stage if c.kind in P2P_KINDS else -1
            op_of_call[i] = len(ops)
            ops.append(TemplateOp(c.kind, tags[i], _deps(pending), axis=c.axis,
                                  size_bytes=c.size_bytes, peer_stage=peer_stage,
                                  split=c.split))
        else:
            assert c.wait is not None
            pending.append(op_of_call[i])
            cursor = max(cursor, c.wait[1])
    compute(run.t_end_s)
    return ops


def _deps(pending: list[int]) -> tuple[int, ...]:
    return tuple(sorted(set(pending)))
