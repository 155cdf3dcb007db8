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
  from ``Input Dims``/``Input type``, groups inferred.
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
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads.captured import (
    KINDS,
    Call,
    CaptureError,
    RankRun,
    axis_of_desc,
    schedule_from_runs,
)
from workloads.comm_groups import GroupInferenceError, GroupView, assign_groups
from workloads.schedule import Schedule
from workloads.steps import P2P_KINDS, chunk_sizes

WAIT_SLACK_US = 1000.0
US = 1e-6

#: c10d / NCCL / gloo collective names (lower case, prefix and trailing "_" removed) -> kind
KIND_OF_NAME = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "_allgather_base": "all_gather", "allgather": "all_gather", "all_gather": "all_gather",
    "_all_gather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_coalesced": "all_gather",
    "all_gather_single": "all_gather",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reducescatter": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "send": "send", "recv": "recv",
    "all_to_allv": "all_to_all", "all_to_all": "all_to_all", "alltoall_base": "all_to_all",
    "alltoall": "all_to_all", "all_to_all_single": "all_to_all",
}
#: L3: index of the message tensor (the input) in a c10d op's ``Input Dims``
C10D_INPUT_INDEX = {"_allgather_base": 1, "_reduce_scatter_base": 1, "allgather": 1,
                    "reduce_scatter": 1, "allgather_into_tensor_coalesced": 1,
                    "reduce_scatter_tensor_coalesced": 1, "alltoall_base": 1, "alltoall": 1}
#: gloo annotation names that can carry each kind (gloo runs reduce-scatter as all-reduce)
GLOO_NAMES = {"all_gather": ("gloo:all_gather", "gloo:allgather"),
              "reduce_scatter": ("gloo:all_reduce", "gloo:reduce_scatter"),
              "all_reduce": ("gloo:all_reduce",), "send": ("gloo:send",),
              "recv": ("gloo:recv",), "all_to_all": ("gloo:all_to_all", "gloo:alltoall")}
DTYPE_BYTES = {
    "float": 4, "float32": 4, "Float": 4, "double": 8, "float64": 8, "Double": 8,
    "c10::Half": 2, "Half": 2, "float16": 2, "c10::BFloat16": 2, "BFloat16": 2, "bfloat16": 2,
    "long int": 8, "Long": 8, "int64": 8, "int": 4, "Int": 4, "int32": 4,
    "short int": 2, "Short": 2, "int16": 2, "unsigned char": 1, "Byte": 1, "uint8": 1,
    "signed char": 1, "Char": 1, "int8": 1, "bool": 1, "Bool": 1,
    "c10::Float8_e4m3fn": 1, "Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "Float8_e5m2": 1,
}
COMM_PREFIXES = ("c10d::", "record_param_comms", "nccl:", "gloo:", "opus:")
NCCL_KERNEL_PREFIXES = ("ncclDevKernel_", "ncclKernel_")
P2P_NAME = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")


class KinetoError(CaptureError):
    """A trace that cannot be imported; the message names the file, the event and why.

    (What the traces show but a schedule cannot hold is a :class:`CaptureError` too.)"""


@dataclass
class Group:
    """A process group of one trace's ``pg_config``."""

    name: str
    desc: str
    ranks: tuple[int, ...]


@dataclass
class Trace:
    """One rank's trace: its complete events (``ph: X``) and process groups."""

    path: str
    rank: int
    world_size: int
    groups: dict[str, Group]
    events: list[dict[str, Any]]
    layout: str = ""
    gpu: bool = False


@dataclass
class RawCall:
    """A collective call found in a trace, before its group is known for sure."""

    kind: str
    event: dict[str, Any]
    size_bytes: int
    source: str
    candidates: list[str]  # group names it may belong to
    group_peer: int = -1  # p2p: the peer's rank in the group
    split: tuple[int, ...] = ()
    done_us: float | None = None  # when it completed (gloo annotation, NCCL kernel), if known
    lane: Any = None  # L3: the gloo worker thread that ran it (one process group's thread)
    group: str | None = None

    @property
    def ts(self) -> float:
        return float(self.event["ts"])


@dataclass
class Imported:
    """The result of an import: the schedule and what it was made from."""

    schedule: Schedule
    layouts: dict[int, str]
    step: str
    calls: dict[int, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # choices made for the user, to print


# --- loading ---------------------------------------------------------------------------------

def load_trace(path: str | Path) -> Trace:
    """Read one ``.json`` or ``.json.gz`` trace; refuse it without a distributed rank."""
    p = str(path)
    try:
        opener = gzip.open if p.endswith(".gz") else open
        with opener(p, "rt") as fh:
            text = fh.read()
    except EOFError as exc:
        raise KinetoError(f"{p}: truncated: the compressed file ends early ({exc}); was the "
                          "trace still being written?") from exc
    except (UnicodeDecodeError, gzip.BadGzipFile) as exc:
        raise KinetoError(f"{p}: not a Chrome trace (JSON): {exc}") from exc
    except OSError as exc:
        raise KinetoError(f"{p}: cannot read it: {exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        if not text.strip():
            raise KinetoError(f"{p}: empty file (0 bytes of JSON)") from exc
        if exc.pos >= len(text.rstrip()):
            raise KinetoError(f"{p}: truncated: the JSON ends at byte {len(text)} in the "
                              "middle of the document; was the trace still being written?"
                              ) from exc
        raise KinetoError(f"{p}: not a Chrome trace (JSON): {exc}") from exc
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
    return Trace(p, int(info["rank"]), int(info.get("world_size", 0)), groups, events)


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


def kind_of(name: str) -> str | None:
    """The schedule kind of a collective name in any spelling, None if it has none."""
    base = name
    for prefix in ("c10d::", "nccl:", "gloo:", "opus:"):
        base = base.removeprefix(prefix)
    base = base.lower()
    return KIND_OF_NAME.get(base, KIND_OF_NAME.get(base.rstrip("_")))


def _source(trace: Trace, e: dict[str, Any]) -> str:
    a = e.get("args", {})
    ids = ", ".join(f"{k} {a[k]}" for k in ("Ev Idx", "External id") if k in a)
    return f"{trace.path}: event '{e['name']}' at ts {e['ts']}" + (f" ({ids})" if ids else "")


# --- calls per layout ------------------------------------------------------------------------

def _is_comm(name: str) -> bool:
    return name.startswith(COMM_PREFIXES)


def _comm_events(trace: Trace) -> list[dict[str, Any]]:
    """The events that are collective calls in this trace's layout, in issue order."""
    match = {"L4": lambda e: e["name"].startswith("opus:"),
             "L1": lambda e: e["name"] == "record_param_comms",
             "L2": lambda e: e["name"].startswith("nccl:"),
             "L3": lambda e: e["name"].startswith("c10d::") and e.get("cat") == "cpu_op"}
    pick = match.get(trace.layout)
    if pick is None:
        return []
    return sorted((e for e in trace.events if e.get("cat") != "kernel" and pick(e)),
                  key=lambda e: (e["ts"], -float(e.get("dur", 0))))


def _int(value: Any) -> int:
    return int(float(value)) if isinstance(value, str) else int(value)


def _int_list(value: Any) -> list[int] | None:
    """A list of ints from a list or its string form ``"[1, 2]"``; None if truncated/absent."""
    if isinstance(value, list):
        return [_int(v) for v in value]
    if isinstance(value, str) and value.strip().startswith("["):
        if "..." in value or "…" in value:
            return None
        inner = value.strip()[1:-1].strip()
        return [int(x) for x in inner.split(",")] if inner else []
    return None


def _numel(dims: Any) -> int:
    """Elements of a tensor's dims, or summed over a (nested) list of tensors."""
    if isinstance(dims, list) and all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n
    if isinstance(dims, list) and all(isinstance(d, list) for d in dims):
        return sum(_numel(d) for d in dims)
    raise ValueError(f"unreadable dims {dims!r}")


def _first_tensor(dims: Any) -> Any:
    """The dims of the first tensor in a (possibly nested) tensor-list entry."""
    while isinstance(dims, list) and dims and isinstance(dims[0], list):
        dims = dims[0]
    return dims


def _dtype_bytes(trace: Trace, e: dict[str, Any], dtype: Any) -> int:
    if dtype not in DTYPE_BYTES:
        raise KinetoError(f"{_source(trace, e)}: element type {dtype!r} is unknown (known: "
                          f"{', '.join(sorted(DTYPE_BYTES))})")
    return DTYPE_BYTES[dtype]


def _op_name(e: dict[str, Any]) -> str:
    """``c10d::_allgather_base_`` -> ``_allgather_base``; ``nccl:send 0->1`` -> ``send``."""
    return e["name"].split(":")[-1].split()[0].rstrip("_").lower()


def _kind(trace: Trace, e: dict[str, Any], name: str) -> str:
    kind = kind_of(name)
    if kind is None:
        raise KinetoError(f"{_source(trace, e)}: collective {name!r} cannot be mapped to a "
                          f"schedule op (supported: {', '.join(KINDS)})")
    return kind


def _candidates(trace: Trace, kind: str, size: int | None, peer: int = -1) -> list[str]:
    """Groups of this rank that can carry the call: the size fits, the peer is another rank."""
    out = []
    for g in trace.groups.values():
        n = len(g.ranks)
        if n < 2 or trace.rank not in g.ranks or (size is not None and n != size):
            continue
        if kind in P2P_KINDS and not (0 <= peer < n and g.ranks[peer] != trace.rank):
            continue
        out.append(g.name)
    return out


def _groups_text(trace: Trace) -> str:
    return ", ".join(f"{g.desc or g.name} {list(g.ranks)}" for g in trace.groups.values())


def _named_call(trace: Trace, e: dict[str, Any]) -> RawCall | None:
    """L1/L4: a call from the named arguments (None on a one-member group)."""
    a = e.get("args", {})
    kind = _kind(trace, e, str(a.get("Collective name", e["name"].removeprefix("opus:"))))
    src = _source(trace, e)
    try:
        elem = _dtype_bytes(trace, e, a.get("dtype"))
        size = _int(a["In msg nelems"]) * elem
        group_size = _int(a.get("Group size", 0)) or None
        peer = _int(a["Rank"]) if kind in P2P_KINDS else -1
    except (KeyError, TypeError, ValueError) as exc:
        raise KinetoError(f"{src}: missing or bad argument {exc} (In msg nelems, dtype, Group "
                          "size; Rank for send/recv)") from exc
    name = a.get("Process Group Name")
    ranks = _int_list(a.get("Process Group Ranks"))
    if ranks is None and name is not None and str(name) in trace.groups:
        ranks = list(trace.groups[str(name)].ranks)
    if ranks is None and "Global rank start" in a and group_size:
        start, stride = _int(a["Global rank start"]), _int(a.get("Global rank stride", 1))
        ranks = [start + i * stride for i in range(group_size)]
    if group_size == 1 or (ranks is not None and len(ranks) < 2):
        return None
    call = RawCall(kind, e, size, src, [], group_peer=peer)
    if ranks is not None:
        key = str(name) if name is not None else f"ranks{ranks}"
        known = trace.groups.get(key)
        if known is not None and list(known.ranks) != ranks:
            raise KinetoError(f"{src}: group {key} has ranks {ranks} here but "
                              f"{list(known.ranks)} in distributedInfo.pg_config")
        if known is None:
            trace.groups[key] = Group(key, str(a.get("Process Group Description", "")),
                                      tuple(ranks))
        call.candidates = [key]
    else:
        call.candidates = _candidates(trace, kind, group_size, peer)
    if kind == "all_to_all":
        split = _int_list(a.get("In split size"))
        if split:
            call.split = tuple(n * elem for n in split)
    return call


def _dims_call(trace: Trace, e: dict[str, Any], kind: str, annotation: dict[str, Any] | None
               ) -> RawCall | None:
    """L2/L3: a call from ``Input Dims``/``Input type`` (None on a one-member group)."""
    a = e.get("args", {})
    src = _source(trace, e)
    dims, types = a.get("Input Dims"), a.get("Input type")
    if not isinstance(dims, list) or not dims:
        raise KinetoError(f"{src}: no 'Input Dims' (profile with record_shapes=True)")
    idx = C10D_INPUT_INDEX.get(_op_name(e), 0) if trace.layout == "L3" else 0
    try:
        numel = _numel(dims[idx])
        dtype = types[idx] if isinstance(types, list) and idx < len(types) else None
    except (IndexError, ValueError) as exc:
        raise KinetoError(f"{src}: unreadable 'Input Dims' {dims!r} ({exc})") from exc
    if dtype in (None, "", "TensorList", "GenericList") and annotation is not None:
        dtype = (annotation.get("args", {}).get("Input type") or [None])[0]
    if dtype in (None, "", "TensorList", "GenericList"):
        raise KinetoError(f"{src}: the element type of this {kind} is not in the trace (no "
                          "matching gloo: annotation with an 'Input type')")
    size = numel * _dtype_bytes(trace, e, dtype)
    group_size = None
    if idx == 1 and kind in ("all_gather", "reduce_scatter") and isinstance(dims[0], list) \
            and all(isinstance(d, int) for d in dims[0]) and numel:
        out = _numel(dims[0])
        ratio = out / numel if kind == "all_gather" else numel / max(out, 1)
        group_size = int(ratio) if ratio == int(ratio) else None
    if group_size == 1:
        return None
    peer = -1
    conc = a.get("Concrete Inputs") or []
    if kind in P2P_KINDS:
        named = P2P_NAME.search(e["name"])  # "nccl:send 0->1", "nccl:recv 1<-0" (group ranks)
        try:
            peer = int(named.group(3)) if named else int(conc[2])
        except (IndexError, TypeError, ValueError) as exc:
            raise KinetoError(f"{src}: {kind} without its peer ('Concrete Inputs'[2] or "
                              "'A->B' in the name)") from exc
    call = RawCall(kind, e, size, src, _candidates(trace, kind, group_size, peer),
                   group_peer=peer)
    if kind == "all_to_all" and len(conc) > 4:
        split = _int_list(conc[4])
        if split and sum(split):
            call.split = tuple(n * size // sum(split) for n in split)
    if not call.candidates:
        raise KinetoError(f"{src}: no process group of rank {trace.rank} "
                          f"({_groups_text(trace)}) can carry this {kind}")
    return call


def _gloo_annotations(trace: Trace) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in sorted(trace.events, key=lambda e: e["ts"]):
        if e["name"].startswith("gloo:"):
            out[e["name"]].append(e)
    return out


def _take_annotation(pool: dict[str, list[dict[str, Any]]], kind: str, e: dict[str, Any]
                     ) -> dict[str, Any] | None:
    """The earliest unused gloo annotation that can carry ``e`` (same kind and message size)."""
    try:
        want = _numel(_first_tensor(e["args"]["Input Dims"][
            C10D_INPUT_INDEX.get(_op_name(e), 0)]))
    except (KeyError, IndexError, TypeError, ValueError):
        want = None
    best: tuple[str, int] | None = None
    for name in GLOO_NAMES.get(kind, ()):
        for i, ann in enumerate(pool.get(name, [])):
            if ann["ts"] < e["ts"]:
                continue
            try:
                have = _numel((ann.get("args", {}).get("Input Dims") or [None])[0])
            except ValueError:
                have = None
            if want is None or have is None or have == want:
                if best is None or ann["ts"] < pool[best[0]][best[1]]["ts"]:
                    best = (name, i)
                break
    return pool[best[0]].pop(best[1]) if best else None


def raw_calls(trace: Trace, t0: float = float("-inf"), t1: float = float("inf")
              ) -> list[RawCall]:
    """The collective calls issued in [t0, t1) µs in issue order, with sizes and candidate
    groups; calls outside are skipped (still keeping gloo annotations and NCCL kernels, which
    are matched in order, in step), so a broadcast at start-up does not stop the import."""
    out = []
    pool = _gloo_annotations(trace) if trace.layout == "L3" else {}
    comm = _comm_events(trace)
    kernel_end = _nccl_kernel_ends(trace, comm) if trace.gpu else {}
    for e in comm:
        named = trace.layout in ("L1", "L4")
        name = str(e.get("args", {}).get("Collective name", e["name"].removeprefix("opus:"))
                   ) if named else _op_name(e)
        if not t0 <= e["ts"] < t1:
            kind = kind_of(name)
            if pool and kind is not None:
                _take_annotation(pool, kind, e)
            continue
        if named:
            call = _named_call(trace, e)
        else:
            kind = _kind(trace, e, name)
            if trace.layout == "L2" and "Input Dims" not in e.get("args", {}):
                e = _with_enclosing_args(trace, e)
            ann = _take_annotation(pool, kind, e) if pool else None
            call = _dims_call(trace, e, kind, ann)
            if call is not None and ann is not None:
                call.done_us = float(ann["ts"]) + float(ann.get("dur", 0))
                if ann.get("tid") != e.get("tid"):  # a collective on its group's worker
                    call.lane = ann.get("tid")
        if call is not None:
            call.done_us = kernel_end.get(id(e), call.done_us)
            out.append(call)
    return out


def _with_enclosing_args(trace: Trace, e: dict[str, Any]) -> dict[str, Any]:
    """L2: an ``nccl:`` annotation with the arguments of its ``record_param_comms`` op."""
    end = float(e["ts"]) + float(e.get("dur", 0))
    for o in trace.events:
        if o["name"] == "record_param_comms" and o.get("tid") == e.get("tid") \
                and o["ts"] <= e["ts"] and float(o["ts"]) + float(o.get("dur", 0)) >= end:
            return {**e, "args": {**o.get("args", {}), **e.get("args", {})}}
    return e


def _nccl_kernel_ends(trace: Trace, comm: list[dict[str, Any]]) -> dict[int, float]:
    """L1-GPU: the end of each call's NCCL kernel, by ``id`` of the call's event: the ``k``-th
    kernel of a process group belongs to that group's ``k``-th call."""
    kernels: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in sorted(trace.events, key=lambda e: e["ts"]):
        if e.get("cat") == "kernel" and e["name"].startswith(NCCL_KERNEL_PREFIXES):
            kernels[str(e.get("args", {}).get("Process Group Name", ""))].append(e)
    out: dict[int, float] = {}
    taken: dict[str, int] = defaultdict(int)
    for e in comm:
        key = str(e.get("args", {}).get("Process Group Name", ""))
        key = key if key in kernels else ""
        k = taken[key]
        if k < len(kernels.get(key, [])):
            kern = kernels[key][k]
            out[id(e)] = float(kern["ts"]) + float(kern.get("dur", 0))
            taken[key] += 1
    return out


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
        raise KinetoError(str(exc)) from exc
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
                  and not _is_comm(e["name"]) and float(e["ts"]) < t1
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
    traces: dict[int, Trace] = {}
    for p in paths:
        t = load_trace(p)
        if t.rank in traces:
            raise KinetoError(f"{t.path}: rank {t.rank} again (also {traces[t.rank].path})")
        traces[t.rank] = t
    first = next(iter(traces.values()))
    for t in traces.values():
        if t.world_size != first.world_size:
            raise KinetoError(f"{t.path}: world_size {t.world_size}, but {first.path} says "
                              f"{first.world_size}")
    missing = sorted(set(range(first.world_size)) - set(traces))
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
    axes = _default_axes(traces, calls, given)
    notes = [f"{WORLD_DESC} (torch's world group, the only group the job uses) taken as the dp "
             f"axis; --axis {WORLD_DESC}=AXIS names another"] if axes != given else []
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


WORLD_DESC = "default_pg"


def _default_axes(traces: dict[int, Trace], calls: dict[int, list[RawCall]],
                  axes: dict[str, str] | None) -> dict[str, str]:
    """``axes`` with ``default_pg`` -> ``dp`` when every call is on the world group: plain
    DDP, whose only group is the one torch names ``default_pg``. With any other axis in the
    job the world group's role (a sync, a data-parallel axis, ...) is the user's to name."""
    out = dict(axes or {})
    descs = {traces[r].groups[c.group].desc or c.group
             for r, lst in calls.items() for c in lst if c.group is not None}
    if descs == {WORLD_DESC} and WORLD_DESC not in out:
        out[WORLD_DESC] = "dp"
    return out


def _call(trace: Trace, c: RawCall, wait: tuple[float, float] | None,
          axes: dict[str, str] | None) -> Call:
    assert c.group is not None
    g = trace.groups[c.group]
    axis = axis_of_desc(g.desc, axes) if g.desc else (axes or {}).get(g.name)
    if axis is None:
        raise KinetoError(f"{c.source}: group {g.desc or g.name} {list(g.ranks)} has no "
                          f"schedule axis; name one with --axis {g.desc or g.name}=AXIS")
    split = c.split
    if c.kind == "all_to_all" and not split:
        split = tuple(chunk_sizes(c.size_bytes, len(g.ranks)))
    return Call(c.kind, axis, g.ranks, c.size_bytes, c.ts * US,
                peer=g.ranks[c.group_peer] if c.kind in P2P_KINDS else -1, split=split,
                wait=(wait[0] * US, wait[1] * US) if wait else None, source=c.source)


def experiment_yaml(imported: Imported, name: str, schedule_file: str = "workload.json") -> str:
    """A runnable experiment file for an imported schedule (``workload: {schedule: ...}``)."""
    s = imported.schedule
    sources = (s.origin or {}).get("sources", [])
    return (f"# Imported by `opus-testbed import kineto` ({imported.step}) from:\n"
            + "".join(f"#   {p}\n" for p in sources)
            + f"name: {json.dumps(name)}\n"
            f"cluster: {{servers: {s.cluster.servers}, gpus_per_server: "
            f"{s.cluster.gpus_per_server}}}\n"
            f"workload: {{schedule: {schedule_file}}}\n"
            "mode: on-demand\n"
            "ocs: {switching_delay: 10}\n"
            "run: {warmup: 1, iterations: 2}\n")


def check_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` if it is new or an empty directory; refused otherwise (nothing written)."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise KinetoError(f"{out}: exists and is not an empty directory; nothing was written")
    return out


def write_import(imported: Imported, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``workload.json`` and ``experiment.yaml`` into a new or empty ``out_dir``."""
    out = check_out_dir(out_dir)
    created = not out.exists()
    files = [out / "workload.json", out / "experiment.yaml"]
    try:
        out.mkdir(parents=True, exist_ok=True)
        imported.schedule.to_json(str(files[0]))
        files[1].write_text(experiment_yaml(imported, name))
    except OSError as exc:
        for f in files:
            f.unlink(missing_ok=True)
        if created and out.exists():
            out.rmdir()
        raise KinetoError(f"{out}: cannot write the import: {exc}") from exc
    return files
