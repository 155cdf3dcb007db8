"""``opus-testbed import kineto``: ``torch.profiler`` Chrome traces (one per rank) -> a schedule.

Pure JSON: no torch import. Each trace's rank and process groups come from its top-level
``distributedInfo`` (``rank``, ``world_size``, ``pg_config``). The layout is detected per file
by the keys present, not by version:

* **L4** ``opus:<kind>`` events (this project's torch backend) with the L1 argument names.
* **L1** ``record_param_comms`` CPU ops with named arguments (``Collective name``,
  ``In msg nelems``, ``dtype``, ``Process Group Name``/``Ranks``, ``Rank`` = the p2p peer's
  group rank, ``In split size``); **L1-GPU** adds ``ncclDevKernel_*``/``ncclKernel_*``
  kernels, which give completion times, and compute kernels, which give the compute time.
* **L2** ``nccl:<op>`` annotations (``record_param_comms`` without named arguments): sizes
  from ``Input Dims``/``Input type`` (the annotation's, else its ``record_param_comms``
  op's), groups inferred; **L2-GPU** adds NCCL kernels (linked by ``External id``). PyTorch
  2.0 writes a ``distributedInfo`` without ``pg_config``: the world group is then the only
  group (:attr:`Trace.pg_known`), and a call that cannot be on it is refused.
* **L3** ``c10d::<op>`` CPU ops with ``gloo:<algorithm>`` annotations (torch 2.13 on CPU):
  sizes from ``Input Dims`` (for ``_base_`` ops the input is the second entry) and the gloo
  annotation's ``Input type``, the p2p peer from ``Concrete Inputs[2]`` (group rank),
  completion from the annotation's end; groups inferred.

Kinds: all-reduce, all-gather, reduce-scatter, send, recv and all-to-all (with its splits) in
their c10d/NCCL spellings; anything else (broadcast, barrier, gather, scatter, reduce, ...)
is refused, as are groups that cannot be resolved and members that disagree. Groups without
names are resolved from what the traces carry, never from timestamps compared across ranks
(:mod:`workloads.comm_groups`): the ``pg_config`` groups of the right size where the op is
valid, each rank's issue order (every member of a group issues the same collectives in the
same order; a pair's sends meet the receives in order), sizes, p2p peers, and in L3 the gloo
worker thread that ran each collective (a process group's own threads); exactly one
consistent assignment is accepted, several are refused naming the first call they disagree
on. Calls on one-member groups move no bytes and are dropped. Axes come from the group
descriptors (``mesh_pp`` -> ``pp``, ...; :data:`workloads.captured.DESC_AXES`, ``axes`` overrides);
torch's world group ``default_pg`` is ``dp`` when the job has no other group (plain DDP).
Refused as a whole, naming the file and the cause: an empty trace, a truncated one, one rank of
a larger job, a trace with no call in a known layout, an iteration without calls.

Iteration: ``ProfilerStep#N`` spans (``step``, default the last one every trace has), else the
optimizer steps (``Optimizer.step#...``: iteration ``k`` ends with the ``k``-th), else the
whole trace. Compute: the main thread's time between call issues, minus the stretches where it
was blocked in a wait. A wait is inferred where the thread ran no CPU op (a stretch between
its leaf ops) and one of its calls completed inside that stretch, at most
:data:`WAIT_SLACK_US` before it ended; the compute after it then depends on the call. With GPU
kernels the compute time is the busy time of the non-communication kernels launched between
two events. Any refusal names the file, the event and why (:class:`KinetoError`).

Modules: this one loads the traces, settles groups, iterations, waits and compute;
:mod:`workloads.kineto_calls` finds the calls of each layout; :mod:`workloads.trace_common`
holds what the Kineto and execution-trace importers share (names, sizes, writing the import).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workloads.captured import Call, RankRun, axis_of_desc, schedule_from_runs
from workloads.comm_groups import GroupInferenceError, GroupView, assign_groups
from workloads.kineto_calls import (
    NCCL_KERNEL_PREFIXES,
    KinetoError,
    RawCall,
    Trace,
    is_comm,
    raw_calls,
)
from workloads.steps import P2P_KINDS, chunk_sizes
from workloads.trace_common import (
    WORLD_DESC,
    Group,
    Imported,
    TraceImportError,
    by_rank,
    check_out_dir,
    default_axes,
    experiment_yaml,
    kind_of,
    read_json,
    world_note,
    write_import,
)

__all__ = ["Imported", "KinetoError", "check_out_dir", "detect_layout", "experiment_yaml",
           "import_traces", "iterations", "kind_of", "load_trace", "raw_calls", "write_import"]

WAIT_SLACK_US = 1000.0
WORLD_NAME = "0"  # torch's name of the world group (``pg_config``'s ``pg_name`` of default_pg)
US = 1e-6


# --- loading ---------------------------------------------------------------------------------

def load_trace(path: str | Path) -> Trace:
    """Read one ``.json`` or ``.json.gz`` trace; refuse it without a distributed rank."""
    p = str(path)
    doc = read_json(p, KinetoError, "a Chrome trace")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise KinetoError(f"{p}: not a torch.profiler Chrome trace (no 'traceEvents' list)")
    info = doc.get("distributedInfo")
    if not isinstance(info, dict) or not isinstance(info.get("rank"), int):
        raise KinetoError(f"{p}: no distributedInfo.rank; the profiler writes it when "
                          "torch.distributed is initialised before the trace starts")
    groups = {}
    for g in info.get("pg_config") or []:
        try:
            groups[str(g["pg_name"])] = Group(str(g["pg_name"]), str(g.get("pg_desc", "")),
                                              tuple(int(r) for r in g["ranks"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise KinetoError(f"{p}: bad distributedInfo.pg_config entry {g!r}") from exc
    events = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
              and isinstance(e.get("ts"), int | float) and isinstance(e.get("name"), str)]
    if not events:
        raise KinetoError(f"{p}: empty: no complete ('ph': 'X') events. A profiler with "
                          "schedule= records only in its active steps and hands each cycle "
                          "to on_trace_ready; export there (or call prof.step() every "
                          "iteration inside the with block), not after it")
    world = info.get("world_size")
    pg_known = "pg_config" in info
    if not pg_known:  # PyTorch before about 2.2: rank and world size only
        if not isinstance(world, int) or world < 1 or not 0 <= info["rank"] < world:
            raise KinetoError(f"{p}: distributedInfo has neither pg_config nor a valid "
                              f"world_size ({world!r}) for rank {info['rank']}")
        groups[WORLD_NAME] = Group(WORLD_NAME, WORLD_DESC, tuple(range(world)))
    return Trace(p, int(info["rank"]), int(world or 0), groups, events, pg_known=pg_known)


def detect_layout(trace: Trace) -> str:
    """``L4`` | ``L1`` | ``L2`` | ``L3`` (see the module docstring), ``none`` without calls."""
    names = {e["name"] for e in trace.events}
    if any(n.startswith("opus:") for n in names):
        return "L4"
    if any(e["name"] == "record_param_comms" and "Collective name" in e.get("args", {})
           for e in trace.events):
        return "L1"
    if any(n.startswith("nccl:") for n in names):
        return "L2"
    if any(n.startswith("c10d::") for n in names):
        return "L3"
    return "none"


# --- groups across ranks ---------------------------------------------------------------------

def resolve_groups(traces: dict[int, Trace], calls: dict[int, list[RawCall]]) -> None:
    """Settle every call's group from what the traces carry (:mod:`workloads.comm_groups`):
    names and ranks where the call has them, else the ``pg_config`` groups that fit it, each
    rank's issue order, sizes, peers and (L3) the gloo worker thread that ran it. Never
    timestamps compared across ranks; refused unless exactly one assignment is consistent."""
    view = GroupView({r: {n: g.ranks for n, g in t.groups.items()} for r, t in traces.items()},
                     lambda r, n: f"{traces[r].groups[n].desc or n} "
                                  f"{list(traces[r].groups[n].ranks)}")
    lanes = {(r, i): c.lane for r, lst in calls.items() for i, c in enumerate(lst)
             if c.lane is not None}
    try:
        groups = assign_groups(calls, view, lanes)
    except GroupInferenceError as exc:
        bare = sorted(r for r, t in traces.items() if not t.pg_known)
        why = (f" (the traces of ranks {bare} carry no process groups: their distributedInfo "
               "has rank and world_size only, as PyTorch before about 2.2 writes it, so the "
               "world group is the only one known and a call that is not on it cannot be "
               "placed)") if bare else ""
        raise KinetoError(f"{exc}{why}") from exc
    for (r, i), name in groups.items():
        calls[r][i].group = name


# --- iteration, waits, compute -------------------------------------------------------------

STEP_RE = re.compile(r"ProfilerStep#(\d+)$")


def iterations(trace: Trace) -> tuple[str, dict[int, tuple[float, float]]]:
    """(how, {step: (start_us, end_us)}): ``ProfilerStep#N`` spans, else the optimizer steps
    (iteration ``k`` ends with the ``k``-th ``Optimizer.step#``), else the whole trace."""
    spans = {}
    for e in trace.events:
        m = STEP_RE.match(e["name"])
        if m:
            spans[int(m.group(1))] = (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
    if spans:
        return "ProfilerStep", spans
    start = min((float(e["ts"]) for e in trace.events), default=0.0)
    ends = sorted(float(e["ts"]) + float(e.get("dur", 0)) for e in trace.events
                  if e["name"].startswith("Optimizer.step#"))
    if ends:
        bounds = [start, *ends]
        return "optimizer step", {k: (bounds[k], bounds[k + 1]) for k in range(len(ends))}
    end = max((float(e["ts"]) + float(e.get("dur", 0)) for e in trace.events), default=0.0)
    return "whole trace", {0: (start, end)}


def choose_step(traces: dict[int, Trace], step: int | None
                ) -> tuple[str, int, dict[int, tuple[float, float]]]:
    """The iteration to import: ``step`` or the last one every trace has; its bounds per rank."""
    found = {r: iterations(t) for r, t in traces.items()}
    hows = {how for how, _ in found.values()}
    if len(hows) > 1:
        raise KinetoError("the traces mark iterations differently (" + "; ".join(
            f"{traces[r].path}: {how}" for r, (how, _) in sorted(found.items())) + ")")
    how = hows.pop()
    common = set.intersection(*(set(s) for _, s in found.values()))
    if step is None:
        if not common:
            raise KinetoError("no " + how + " is in every trace")
        step = max(common)
    for r, (_, spans) in sorted(found.items()):
        if step not in spans:
            raise KinetoError(f"{traces[r].path}: has no {how} {step} (it has "
                              f"{sorted(spans)}); choose one with --step")
    return how, step, {r: spans[step] for r, (_, spans) in found.items()}


def _main_thread(trace: Trace, calls: list[RawCall]) -> Any:
    counts: dict[Any, int] = defaultdict(int)
    for c in calls:
        counts[c.event.get("tid")] += 1
    if not counts:
        for e in trace.events:
            counts[e.get("tid")] += e.get("cat") == "cpu_op"
    return max(counts, key=lambda t: counts[t]) if counts else None


def _leaf_spans(trace: Trace, tid: Any, t0: float, t1: float) -> list[tuple[float, float]]:
    """Busy spans of the main thread: its innermost CPU ops, communication calls left out."""
    ops = sorted(((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
                  for e in trace.events if e.get("tid") == tid and e.get("cat") == "cpu_op"
                  and not is_comm(e["name"]) and float(e["ts"]) < t1
                  and float(e["ts"]) + float(e.get("dur", 0)) > t0),
                 key=lambda s: (s[0], -s[1]))
    if not ops:  # a thread that ran no CPU op in the step (zip below wants one at least)
        return []
    return [a for a, b in zip(ops, [*ops[1:], (float("inf"), 0.0)], strict=True)
            if b[0] >= a[1]]


def infer_waits(trace: Trace, calls: list[RawCall], t0: float, t1: float
                ) -> dict[int, tuple[float, float]]:
    """Blocked stretches of the main thread (µs), by the index of the call it waited for."""
    tid = _main_thread(trace, calls)
    cuts = sorted({c.ts for c in calls if t0 <= c.ts < t1})
    idle: list[tuple[float, float]] = []
    cursor = t0
    for a, b in _leaf_spans(trace, tid, t0, t1):
        if a > cursor:
            idle.append((cursor, a))
        cursor = max(cursor, b)
    if cursor < t1:
        idle.append((cursor, t1))
    stretches = []
    for a, b in idle:  # an issue is a main-thread event: never inside a wait
        inner = [c for c in cuts if a < c < b]
        for x, y in zip([a, *inner], [*inner, b], strict=True):
            stretches.append((x, y))
    waits = {}
    for i, c in enumerate(calls):
        if c.done_us is None or not t0 <= c.ts < t1:
            continue
        for a, b in stretches:
            if a <= c.done_us <= b and b - c.done_us <= WAIT_SLACK_US and c.ts <= a:
                waits[i] = (a, b)
                break
    return waits


def _gpu_busy(trace: Trace) -> Callable[[float, float], float]:
    """``busy_s(t0, t1)``: union time of compute kernels launched in [t0, t1) (seconds)."""
    launch = {e.get("args", {}).get("correlation"): float(e["ts"]) for e in trace.events
              if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    kernels = []
    for e in trace.events:
        if e.get("cat") == "kernel" and not e["name"].startswith(NCCL_KERNEL_PREFIXES):
            start = float(e["ts"])
            at = launch.get(e.get("args", {}).get("correlation"), start)
            kernels.append((at * US, start * US, (start + float(e.get("dur", 0))) * US))

    def busy_s(t0: float, t1: float) -> float:
        total, end = 0.0, float("-inf")
        for s, e in sorted((s, e) for at, s, e in kernels if t0 <= at < t1):
            if e > end:
                total += e - max(s, end)
                end = e
        return total

    return busy_s


# --- the import ------------------------------------------------------------------------------

def load_traces(paths: Sequence[str | Path]) -> dict[int, Trace]:
    """Every trace by rank; the world must agree and ranks 0..N-1 be there once each."""
    if not paths:
        raise KinetoError("no trace files given")
    traces, missing = by_rank((load_trace(p) for p in paths), KinetoError, "world_size")
    first = next(iter(traces.values()))
    if missing:
        given = "a single rank" if len(traces) == 1 else f"{len(traces)} ranks"
        raise KinetoError(f"{given} of a {first.world_size}-rank job: the traces of ranks "
                          f"{missing} are missing (world_size {first.world_size}); give one "
                          "trace per rank (torch.profiler writes one file per rank)")
    for t in traces.values():
        t.layout = detect_layout(t)
        if t.layout == "none":
            raise KinetoError(f"{t.path}: unknown layout: no collective call in any layout "
                              "the importer reads (record_param_comms, nccl:*, c10d::* CPU "
                              "ops, opus:*); profile with activities=[ProfilerActivity.CPU] "
                              "after torch.distributed is initialised")
        t.gpu = any(e.get("cat") == "kernel" and e["name"].startswith(NCCL_KERNEL_PREFIXES)
                    for e in t.events)
    return traces


def import_traces(paths: Sequence[str | Path], *, gpus_per_server: int = 1,
                  step: int | None = None, axes: dict[str, str] | None = None) -> Imported:
    """The schedule of one iteration of the traced job (see the module docstring)."""
    traces = load_traces(paths)
    how, step, bounds = choose_step(traces, step)
    calls = {}
    for r, t in traces.items():
        t0, t1 = bounds[r]
        calls[r] = raw_calls(t, t0, t1)
    if not any(calls.values()):
        raise KinetoError(f"no collective call in {how} {step} of any trace (the traces "
                          "have calls elsewhere); choose another iteration with --step")
    resolve_groups(traces, calls)
    given = dict(axes or {})
    axes = default_axes({traces[r].groups[c.group].desc or c.group for r, lst in calls.items()
                         for c in lst if c.group is not None}, given)
    notes = world_note(axes, given)
    runs = {}
    for r, t in traces.items():
        t0, t1 = bounds[r]
        waits = infer_waits(t, calls[r], t0, t1)
        out = [_call(t, c, waits.get(i), axes) for i, c in enumerate(calls[r])]
        runs[r] = RankRun(r, out, t0 * US, t1 * US, _gpu_busy(t) if t.gpu else None)
    label = f"{how} {step}" if how != "whole trace" else how
    layouts = {r: traces[r].layout + ("-GPU" if traces[r].gpu else "") for r in sorted(traces)}
    origin = {"kind": "kineto", "sources": [traces[r].path for r in sorted(traces)],
              "torch_version": None, "iteration": label,
              "layouts": {str(r): lay for r, lay in layouts.items()}}
    schedule = schedule_from_runs(runs, gpus_per_server=gpus_per_server, origin=origin)
    return Imported(schedule, layouts, label, {r: len(c) for r, c in sorted(calls.items())},
                    notes)


def _call(trace: Trace, c: RawCall, wait: tuple[float, float] | None,
          axes: dict[str, str] | None) -> Call:
    return call_of(trace, c, c.ts * US, (wait[0] * US, wait[1] * US) if wait else None, axes,
                   KinetoError)


def call_of(trace: Trace, c: RawCall, t_issue_s: float, wait_s: tuple[float, float] | None,
            axes: dict[str, str] | None, error: type[TraceImportError] = TraceImportError
            ) -> Call:
    """The observed call of a resolved raw call, its group's axis from the descriptor (or
    ``axes``); shared with :mod:`workloads.exec_trace`."""
    assert c.group is not None
    g = trace.groups[c.group]
    axis = axis_of_desc(g.desc, axes) if g.desc else (axes or {}).get(g.name)
    if axis is None:
        raise error(f"{c.source}: group {g.desc or g.name} {list(g.ranks)} has no schedule "
                    f"axis; name one with --axis {g.desc or g.name}=AXIS")
    split = c.split
    if c.kind == "all_to_all" and not split:
        split = tuple(chunk_sizes(c.size_bytes, len(g.ranks)))
    return Call(c.kind, axis, g.ranks, c.size_bytes, t_issue_s,
                peer=g.ranks[c.group_peer] if c.kind in P2P_KINDS else -1, split=split,
                wait=wait_s, source=c.source)


