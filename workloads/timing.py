"""A modeled timeline of one iteration, for summaries and window estimates only.

The schedule itself holds no collective durations (the network decides them). To print a
"modeled start" per phase and count windows before anything runs, this module replays the DAG
with an alpha-beta cost per collective (Hockney's model): ``steps * latency_s +
wire_bytes / bandwidth`` (steps and bytes of the collective's algorithm; no switching and no
straggler delays), NVLink bandwidth of the GPU preset for scale-up collectives and
``rail_gbps`` for the rest, no contention. Ranks of one program are symmetric, so only one
representative rank per program is replayed: those of EP group 0 at each pipeline stage,
whose pipeline peers are representatives too.
"""

from __future__ import annotations

import itertools
from collections import defaultdict, deque
from dataclasses import dataclass

from workloads.algorithms import ALGORITHM
from workloads.phases import Phase, phases_of
from workloads.schedule import Op, Schedule


@dataclass(frozen=True)
class TimingModel:
    """Link parameters of the modeled timeline."""

    rail_gbps: float = 200.0
    latency_s: float = 5e-6


class DeadlockError(RuntimeError):
    """The DAG and the rendezvous of collectives leave ops that can never start."""


def representatives(schedule: Schedule) -> list[int]:
    """One rank per program, chosen so that their peers are representatives too.

    A captured schedule has a program per rank (measured compute differs between ranks), so
    there every rank represents itself.
    """
    per_stage = schedule.world_size // schedule.config.parallel.pp
    ep0 = schedule.groups["ep"].ranks[0]
    reps = [s * per_stage + int(r) for s in range(schedule.config.parallel.pp) for r in ep0]
    if len({int(schedule.program_of[r]) for r in reps}) < len(schedule.programs):
        return list(range(schedule.world_size))
    return reps


def collective_duration_s(schedule: Schedule, op: Op, model: TimingModel) -> float:
    """Alpha-beta duration of a collective op."""
    bw_gbps = schedule.config.gpu.scale_up_gbps if op.scale_up else model.rail_gbps
    if op.kind in ("send", "recv"):
        return model.latency_s + op.size_bytes * 8 / (bw_gbps * 1e9)
    n = schedule.groups[op.axis].size
    steps = ALGORITHM[schedule.algorithm_of(op)].step_count(op.kind, n)
    return steps * model.latency_s + op.wire_bytes * 8 / (bw_gbps * 1e9)


def simulate(schedule: Schedule, model: TimingModel | None = None
             ) -> dict[tuple[int, int], tuple[float, float]]:
    """(start_s, end_s) of every op of the representative ranks."""
    model = model or TimingModel()
    reps = representatives(schedule)
    ops = {r: schedule.ops_of(r) for r in reps}
    pending: dict[tuple[int, int], int] = {}
    ready: dict[tuple[int, int], float] = {}
    dependents: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    expected: dict[str, int] = defaultdict(int)
    for r, lst in ops.items():
        for op in lst:
            pending[(r, op.index)] = len(op.deps)
            ready[(r, op.index)] = 0.0
            for d in op.deps:
                dependents[(r, d)].append((r, op.index))
            if op.is_collective:
                expected[op.collective_id] += 1
    arrived: dict[str, list[tuple[int, int]]] = defaultdict(list)
    times: dict[tuple[int, int], tuple[float, float]] = {}
    queue = deque(k for k, n in pending.items() if n == 0)
    while queue:
        key = queue.popleft()
        op = ops[key[0]][key[1]]
        if not op.is_collective:
            done = [(key, ready[key], ready[key] + op.duration_s)]
        else:
            arrived[op.collective_id].append(key)
            if len(arrived[op.collective_id]) < expected[op.collective_id]:
                continue
            members = arrived.pop(op.collective_id)
            start = max(ready[k] for k in members)
            dur = max(collective_duration_s(schedule, ops[k[0]][k[1]], model) for k in members)
            done = [(k, start, start + dur) for k in members]
        for k, start, end in done:
            times[k] = (start, end)
            for nxt in dependents[k]:
                ready[nxt] = max(ready[nxt], end)
                pending[nxt] -= 1
                if pending[nxt] == 0:
                    queue.append(nxt)
    if len(times) != len(pending):
        stuck = next(k for k in pending if k not in times)
        raise DeadlockError(f"rank {stuck[0]} op {stuck[1]} ({ops[stuck[0]][stuck[1]].tag}) "
                            "can never start")
    return times


@dataclass(frozen=True)
class TimedPhase:
    """A phase with its modeled start and end."""

    phase: Phase
    start_s: float
    end_s: float


def timed_phases(schedule: Schedule, rank: int, model: TimingModel | None = None,
                 include_scale_up: bool = False) -> tuple[list[TimedPhase], float]:
    """Phases of ``rank`` with modeled times, and the modeled iteration time."""
    times = simulate(schedule, model)
    reps = representatives(schedule)
    rep = next(r for r in reps if int(schedule.program_of[r]) == int(schedule.program_of[rank]))
    out = []
    for ph in phases_of(schedule, rank, include_scale_up):
        spans = [times[(rep, i)] for i in ph.op_indices]
        out.append(TimedPhase(ph, min(s for s, _ in spans), max(e for _, e in spans)))
    return out, max(e for _, e in times.values())


def windows(phases: list[TimedPhase]) -> list[float]:
    """Windows (s) between consecutive phases whose comm group sets differ (paper §3.1)."""
    out = []
    for a, b in itertools.pairwise(phases):
        if set(a.phase.group_ids) != set(b.phase.group_ids):
            out.append(b.start_s - a.end_s)
    return out
