"""``opus-testbed import et``: PyTorch execution traces (one per rank) -> a schedule.

An execution trace (ET) is the JSON ``torch.profiler.ExecutionTraceObserver`` writes, the input
of Chakra's converter: ``{"schema": "1.1.1-chakra.0.0.4", "pid", "time", "start_ts",
"finish_ts", "nodes": [...]}``, each node ``{"id", "name", "ctrl_deps" (the parent's id),
"inputs"/"outputs": {"values", "shapes", "types", "strides"}, "attrs": [{"name", "type",
"value"}]}`` with attributes ``rf_id`` (the record function's sequence number: issue order),
``tid``, ``op_schema``... A tensor value is ``[tensor id, storage id, offset, elements, bytes
per element, device]``. Pure JSON: no torch import. Two layouts, detected per file:

* **ET-c10d** ``c10d::<op>`` nodes (torch 2.13 on CPU/gloo, the project's own recordings by
  ``tests/workloads/et_job.py``): the message is the input tensor (the second input of the
  ``_base`` ops), the group size of an all-gather/reduce-scatter the ratio of its two tensors,
  the p2p peer the third input (its group rank), ``async_op`` the first ``Bool`` input. The
  node names no group: groups are inferred as in the Kineto import
  (:mod:`workloads.comm_groups`: the ranks' issue orders, sizes and peers; one consistent
  assignment or a refusal naming the call).
* **ET-named** ``record_param_comms`` nodes with attributes ``collective_name``,
  ``in_msg_nelems``, ``dtype``, ``pg_name``, ``pg_desc``, ``pg_size``, ``global_rank_start``,
  ``global_rank_stride`` (NCCL; the names are those torch 2.13's observer writes): the group
  is named; the p2p peer is the fourth input (the macro's ``rank``).

The trace holds no rank: it is the last number in the file's name (``rank3.json``,
``chakra.3.json``), checked against the groups of the ``## process_group:init ##`` node, whose
world group's ``group_size`` is the world size. The trace holds no times either, so the
schedule has the calls in each rank's order and their dependencies, and no compute ops: a
blocking call (``async_op`` false, and every send/recv, which the trace cannot tell from
``isend``/``irecv``) holds back the calls after it; an asynchronous one only ends the
iteration. The whole trace is one iteration (the observer runs from ``start()`` to ``stop()``).
Refusals name the file, the node (name, ``id``, ``rf_id``) and why (:class:`ExecTraceError`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workloads.captured import KINDS, RankRun, schedule_from_runs
from workloads.comm_groups import GroupInferenceError
from workloads.kineto import call_of, resolve_groups
from workloads.kineto_calls import KinetoError, RawCall, Trace
from workloads.steps import P2P_KINDS
from workloads.trace_common import (
    DTYPE_BYTES,
    WORLD_DESC,
    Group,
    Imported,
    TraceImportError,
    by_rank,
    default_axes,
    kind_of,
    read_json,
    to_int,
    world_note,
)

PG_INIT = "## process_group:init ##"
RANK_IN_NAME = re.compile(r"(\d+)")
TICK_S = 1e-3  # the synthetic time between two calls of a rank (the trace has no times)
#: c10d ops whose message is their second tensor input (the first is the output)
SECOND_INPUT = {"_allgather_base", "_reduce_scatter_base", "allgather", "reduce_scatter",
                "allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced",
                "alltoall_base", "alltoall"}


class ExecTraceError(TraceImportError):
    """An execution trace that cannot be imported; the message names the file, the node and
    why."""


def rank_of_name(path: str) -> int:
    """The rank in a trace's file name: its last number (``rank3.json`` -> 3)."""
    stem = Path(path).name
    for ext in (".gz", ".json", ".et"):
        stem = stem.removesuffix(ext)
    found = RANK_IN_NAME.findall(stem)
    if not found:
        raise ExecTraceError(f"{path}: an execution trace does not say its rank, and the file "
                             "name has no number to take it from (name the files rank<R>.json)")
    return int(found[-1])


def attrs(node: dict[str, Any]) -> dict[str, Any]:
    """A node's attributes by name."""
    return {str(a.get("name")): a.get("value") for a in node.get("attrs") or []
            if isinstance(a, dict)}


def _source(path: str, node: dict[str, Any]) -> str:
    return (f"{path}: node '{node.get('name')}' (id {node.get('id')}, rf_id "
            f"{attrs(node).get('rf_id')})")


def load_et(path: str | Path) -> Trace:
    """One rank's execution trace as a :class:`Trace` whose events are the ET's nodes."""
    p = str(path)
    doc = read_json(p, ExecTraceError, "an execution trace")
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise ExecTraceError(f"{p}: not a PyTorch execution trace (no 'nodes' list)")
    nodes = [n for n in doc["nodes"] if isinstance(n, dict) and isinstance(n.get("name"), str)]
    rank = rank_of_name(p)
    init = next((n for n in nodes if n["name"] == PG_INIT), None)
    if init is None:
        raise ExecTraceError(f"{p}: no '{PG_INIT}' node: start the ExecutionTraceObserver "
                             "after torch.distributed is initialised (it records the process "
                             "groups then)")
    try:
        pgs = json.loads((init.get("inputs") or {}).get("values", [""])[0])
        world = next(int(g["group_size"]) for g in pgs if g.get("pg_desc") == WORLD_DESC)
        groups = {}
        for g in pgs:
            ranks = tuple(int(r) for r in g.get("ranks") or []) or tuple(
                range(int(g["group_size"])))
            groups[str(g["pg_name"])] = Group(str(g["pg_name"]), str(g.get("pg_desc", "")),
                                              ranks)
    except (IndexError, KeyError, TypeError, ValueError, StopIteration) as exc:
        raise ExecTraceError(f"{_source(p, init)}: unreadable process groups ({exc!r}); "
                             f"expected a JSON list with a {WORLD_DESC} entry") from exc
    if not 0 <= rank < world:
        raise ExecTraceError(f"{p}: the file name says rank {rank}, outside the world of "
                             f"{world} ranks")
    for g in groups.values():
        if rank not in g.ranks:
            raise ExecTraceError(f"{p}: the file name says rank {rank}, but the trace's group "
                                 f"{g.desc or g.name} {list(g.ranks)} does not hold it; name "
                                 "the files by rank (rank<R>.json)")
    nodes.sort(key=lambda n: (to_int(attrs(n).get("rf_id") or 0), to_int(n.get("id") or 0)))
    trace = Trace(p, rank, world, groups, nodes)
    trace.layout = "ET-named" if any(n["name"] == "record_param_comms"
                                     and "collective_name" in attrs(n) for n in nodes) \
        else "ET-c10d"
    return trace


def _is_comm(name: str) -> bool:
    return name == "record_param_comms" or name.startswith("c10d::")


def _tensors(value: Any) -> list[list[Any]]:
    """The tensor values in an input value: one tensor or a (nested) list of them."""
    if isinstance(value, list) and len(value) == 6 and isinstance(value[3], int) \
            and isinstance(value[4], int):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(value: Any) -> tuple[int, int]:
    """(elements, bytes) of the tensors in an input value."""
    ts = _tensors(value)
    return sum(int(t[3]) for t in ts), sum(int(t[3]) * int(t[4]) for t in ts)


def _c10d_call(trace: Trace, node: dict[str, Any]) -> tuple[RawCall | None, bool]:
    """ET-c10d: a call from a ``c10d::`` node (None on a one-member group), and whether it
    blocks."""
    src = _source(trace.path, node)
    op = node["name"].removeprefix("c10d::").rstrip("_").lower()
    kind = kind_of(op)
    if kind is None:
        raise ExecTraceError(f"{src}: collective {op!r} cannot be mapped to a schedule op "
                             f"(supported: {', '.join(KINDS)})")
    inputs = node.get("inputs") or {}
    values, types = inputs.get("values") or [], inputs.get("types") or []
    idx = 1 if op in SECOND_INPUT else 0
    if len(values) <= idx or not _tensors(values[idx]):
        raise ExecTraceError(f"{src}: no input tensor at position {idx}")
    elems, size = _nbytes(values[idx])
    group_size = None
    if idx == 1 and kind in ("all_gather", "reduce_scatter") and elems:
        out = _nbytes(values[0])[0]
        ratio = out / elems if kind == "all_gather" else elems / max(out, 1)
        group_size = int(ratio) if ratio == int(ratio) else None
    if group_size == 1:
        return None, False
    peer = -1
    if kind in P2P_KINDS:
        if len(values) < 3 or not isinstance(values[2], int):
            raise ExecTraceError(f"{src}: {kind} without its peer (third input)")
        peer = values[2]
    bools = [v for v, t in zip(values, types, strict=False) if t == "Bool"]
    blocking = kind in P2P_KINDS or not (bools and bools[0])
    cands = [g.name for g in trace.groups.values() if len(g.ranks) > 1
             and (group_size is None or len(g.ranks) == group_size)
             and (kind not in P2P_KINDS or (0 <= peer < len(g.ranks)
                                            and g.ranks[peer] != trace.rank))]
    if not cands:
        raise ExecTraceError(f"{src}: no process group of rank {trace.rank} ("
                             + ", ".join(f"{g.desc or g.name} {list(g.ranks)}"
                                         for g in trace.groups.values())
                             + f") can carry this {kind}")
    return RawCall(kind, node, size, src, cands, group_peer=peer), blocking


def _named_call(trace: Trace, node: dict[str, Any]) -> tuple[RawCall | None, bool]:
    """ET-named: a call from a ``record_param_comms`` node's attributes."""
    a = attrs(node)
    src = _source(trace.path, node)
    name = str(a.get("collective_name"))
    kind = kind_of(name)
    if kind is None:
        raise ExecTraceError(f"{src}: collective {name!r} cannot be mapped to a schedule op "
                             f"(supported: {', '.join(KINDS)})")
    dtype = a.get("dtype")
    if dtype not in DTYPE_BYTES:
        raise ExecTraceError(f"{src}: element type {dtype!r} is unknown")
    try:
        size = to_int(a["in_msg_nelems"]) * DTYPE_BYTES[dtype]
        pg_size = to_int(a.get("pg_size", 0))
    except (KeyError, TypeError, ValueError) as exc:
        raise ExecTraceError(f"{src}: missing or bad attribute {exc} (in_msg_nelems, "
                             "pg_size)") from exc
    if pg_size == 1:
        return None, False
    key = str(a.get("pg_name"))
    if key not in trace.groups:
        try:
            start, stride = to_int(a["global_rank_start"]), to_int(a["global_rank_stride"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ExecTraceError(f"{src}: group {key!r} is not in the process_group:init "
                                 "node and the node has no global_rank_start/stride") from exc
        trace.groups[key] = Group(key, str(a.get("pg_desc", "")),
                                  tuple(start + i * stride for i in range(pg_size)))
    peer = -1
    if kind in P2P_KINDS:
        values = (node.get("inputs") or {}).get("values") or []
        if len(values) < 4 or not isinstance(values[3], int):
            raise ExecTraceError(f"{src}: {kind} without its peer (the fourth input, "
                                 "record_param_comms' rank)")
        peer = values[3]
    return RawCall(kind, node, size, src, [key], group_peer=peer), True


def et_calls(trace: Trace) -> tuple[list[RawCall], list[bool]]:
    """A rank's calls in issue order (``rf_id``) and whether each blocks. Only outermost
    communication nodes count (a ``record_param_comms`` inside a ``c10d::`` op is one call)."""
    by_id = {n.get("id"): n for n in trace.events}
    named = trace.layout == "ET-named"
    pick = (lambda n: n["name"] == "record_param_comms") if named \
        else (lambda n: n["name"].startswith("c10d::"))
    calls, blocking = [], []
    for node in trace.events:
        if not pick(node):
            continue
        parent, seen = by_id.get(node.get("ctrl_deps")), set()
        nested = False
        while parent is not None and id(parent) not in seen and parent is not node:
            seen.add(id(parent))
            if pick(parent):
                nested = True
                break
            parent = by_id.get(parent.get("ctrl_deps"))
        if nested:
            continue
        call, blocks = _named_call(trace, node) if named else _c10d_call(trace, node)
        if call is not None:
            calls.append(call)
            blocking.append(blocks)
    return calls, blocking


def load_ets(paths: Sequence[str | Path]) -> dict[int, Trace]:
    """Every trace by rank; ranks 0..N-1 once each, N the world size the traces give."""
    if not paths:
        raise ExecTraceError("no trace files given")
    traces, missing = by_rank((load_et(p) for p in paths), ExecTraceError, "world size")
    if missing:
        world = next(iter(traces.values())).world_size
        raise ExecTraceError(f"{len(traces)} traces of a {world}-rank job: ranks "
                             f"{missing} are missing; give one trace per rank")
    return traces


def import_ets(paths: Sequence[str | Path], *, gpus_per_server: int = 1,
               axes: dict[str, str] | None = None) -> Imported:
    """The schedule of the traced calls (see the module docstring)."""
    traces = load_ets(paths)
    calls, blocking = {}, {}
    for r, t in traces.items():
        calls[r], blocking[r] = et_calls(t)
    if not any(calls.values()):
        raise ExecTraceError("no collective call in any trace (was the observer running "
                             "while the job communicated?)")
    try:
        resolve_groups(traces, calls)
    except (KinetoError, GroupInferenceError) as exc:
        raise ExecTraceError(str(exc)) from exc
    given = dict(axes or {})
    axes = default_axes({traces[r].groups[c.group].desc or c.group for r, lst in calls.items()
                         for c in lst if c.group is not None}, given)
    runs = {}
    for r, t in traces.items():
        out = []
        for i, (c, blocks) in enumerate(zip(calls[r], blocking[r], strict=True)):
            at = (i + 1) * TICK_S
            out.append(call_of(t, c, at, (at, at) if blocks else None, axes, ExecTraceError))
        runs[r] = RankRun(r, out, 0.0, (len(out) + 1) * TICK_S, lambda a, b: 0.0)
    layouts = {r: traces[r].layout for r in sorted(traces)}
    origin = {"kind": "execution-trace", "sources": [traces[r].path for r in sorted(traces)],
              "torch_version": None, "iteration": "whole trace",
              "layouts": {str(r): lay for r, lay in layouts.items()}}
    schedule = schedule_from_runs(runs, gpus_per_server=gpus_per_server, origin=origin)
    notes = [*world_note(axes, given), "execution traces carry no times: the schedule has no "
             "compute, only the calls, their order and what blocks"]
    return Imported(schedule, layouts, "whole trace",
                    {r: len(c) for r, c in sorted(calls.items())}, notes, command="import et")
