"""The collective calls in one ``torch.profiler`` trace, per layout (see :mod:`workloads.kineto`).

Each layout names its calls differently (``record_param_comms`` with named arguments, ``nccl:``
annotations, ``c10d::`` ops with ``gloo:`` annotations, ``opus:`` events); this module turns
each into a :class:`RawCall`: kind, message size, the groups it may be on, the p2p peer's group
rank, and when it completed where the trace says so.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from workloads.captured import KINDS
from workloads.steps import P2P_KINDS
from workloads.trace_common import (
    DTYPE_BYTES,
    Group,
    TraceImportError,
    int_list,
    kind_of,
    numel,
    to_int,
)

#: L3: index of the message tensor (the input) in a c10d op's ``Input Dims``
C10D_INPUT_INDEX = {"_allgather_base": 1, "_reduce_scatter_base": 1, "allgather": 1,
                    "reduce_scatter": 1, "allgather_into_tensor_coalesced": 1,
                    "reduce_scatter_tensor_coalesced": 1, "alltoall_base": 1, "alltoall": 1}
#: gloo annotation names that can carry each kind (gloo runs reduce-scatter as all-reduce)
GLOO_NAMES = {"all_gather": ("gloo:all_gather", "gloo:allgather"),
              "reduce_scatter": ("gloo:all_reduce", "gloo:reduce_scatter"),
              "all_reduce": ("gloo:all_reduce",), "send": ("gloo:send",),
              "recv": ("gloo:recv",), "all_to_all": ("gloo:all_to_all", "gloo:alltoall")}
COMM_PREFIXES = ("c10d::", "record_param_comms", "nccl:", "gloo:", "opus:")
NCCL_KERNEL_PREFIXES = ("ncclDevKernel_", "ncclKernel_")
P2P_NAME = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")


class KinetoError(TraceImportError):
    """A Chrome trace that cannot be imported; the message names the file, the event and why."""


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
    #: False when ``distributedInfo`` lists no ``pg_config`` (PyTorch before about 2.2): then
    #: ``groups`` holds only the world group, synthesized from ``world_size``
    pg_known: bool = True


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



def _source(trace: Trace, e: dict[str, Any]) -> str:
    a = e.get("args", {})
    ids = ", ".join(f"{k} {a[k]}" for k in ("Ev Idx", "External id") if k in a)
    return f"{trace.path}: event '{e['name']}' at ts {e['ts']}" + (f" ({ids})" if ids else "")


# --- calls per layout ------------------------------------------------------------------------

def is_comm(name: str) -> bool:
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
    return sorted((e for e in trace.events if on_host(e) and pick(e)),
                  key=lambda e: (e["ts"], -float(e.get("dur", 0))))


def on_host(e: dict[str, Any]) -> bool:
    """An event of the CPU timeline: not a kernel nor the ``gpu_user_annotation`` copy Kineto
    draws of an annotation on the GPU stream (``nccl:all_reduce`` appears on both)."""
    cat = str(e.get("cat", ""))
    return cat != "kernel" and not cat.startswith("gpu_")


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


def _candidates(trace: Trace, kind: str, size: int | None, peer: int = -1,
                me: int = -1) -> list[str]:
    """Groups of this rank that can carry the call: the size fits, the peer is another rank,
    and this rank is group rank ``me`` when the trace says so (``nccl:send 0->1``)."""
    out = []
    for g in trace.groups.values():
        n = len(g.ranks)
        if n < 2 or trace.rank not in g.ranks or (size is not None and n != size):
            continue
        if kind in P2P_KINDS and not (0 <= peer < n and g.ranks[peer] != trace.rank):
            continue
        if me >= 0 and (me >= n or g.ranks[me] != trace.rank):
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
        # "In msg size" is the older name of the same count (about torch 2.1): PyTorch passes
        # tensor.numel() as ParamCommsDebugInfo's inSize either way
        size = to_int(a["In msg nelems"] if "In msg nelems" in a else a["In msg size"]) * elem
        group_size = to_int(a.get("Group size", 0)) or None
        peer = to_int(a["Rank"]) if kind in P2P_KINDS else -1
    except (KeyError, TypeError, ValueError) as exc:
        raise KinetoError(f"{src}: missing or bad argument {exc} (In msg nelems, dtype, Group "
                          "size; Rank for send/recv)") from exc
    name = a.get("Process Group Name")
    ranks = int_list(a.get("Process Group Ranks"))
    if ranks is None and name is not None and str(name) in trace.groups:
        ranks = list(trace.groups[str(name)].ranks)
    if ranks is None and "Global rank start" in a and group_size:
        start, stride = to_int(a["Global rank start"]), to_int(a.get("Global rank stride", 1))
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
        split = int_list(a.get("In split size"))
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
        n = numel(dims[idx])
        dtype = types[idx] if isinstance(types, list) and idx < len(types) else None
    except (IndexError, ValueError) as exc:
        raise KinetoError(f"{src}: unreadable 'Input Dims' {dims!r} ({exc})") from exc
    if dtype in (None, "", "TensorList", "GenericList") and annotation is not None:
        dtype = (annotation.get("args", {}).get("Input type") or [None])[0]
    if dtype in (None, "", "TensorList", "GenericList"):
        raise KinetoError(f"{src}: the element type of this {kind} is not in the trace (no "
                          "matching gloo: annotation with an 'Input type')")
    size = n * _dtype_bytes(trace, e, dtype)
    group_size = None
    if idx == 1 and kind in ("all_gather", "reduce_scatter") and isinstance(dims[0], list) \
            and all(isinstance(d, int) for d in dims[0]) and n:
        out = numel(dims[0])
        ratio = out / n if kind == "all_gather" else n / max(out, 1)
        group_size = int(ratio) if ratio == int(ratio) else None
    if group_size == 1:
        return None
    peer = me = -1
    conc = a.get("Concrete Inputs") or []
    if kind in P2P_KINDS:
        named = P2P_NAME.search(e["name"])  # "nccl:send 0->1", "nccl:recv 1<-0" (group ranks)
        try:
            me = int(named.group(1)) if named else -1
            peer = int(named.group(3)) if named else int(conc[2])
        except (IndexError, TypeError, ValueError) as exc:
            raise KinetoError(f"{src}: {kind} without its peer ('Concrete Inputs'[2] or "
                              "'A->B' in the name)") from exc
    call = RawCall(kind, e, size, src, _candidates(trace, kind, group_size, peer, me),
                   group_peer=peer)
    if kind == "all_to_all" and len(conc) > 4:
        split = int_list(conc[4])
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
        want = numel(_first_tensor(e["args"]["Input Dims"][
            C10D_INPUT_INDEX.get(_op_name(e), 0)]))
    except (KeyError, IndexError, TypeError, ValueError):
        want = None
    best: tuple[str, int] | None = None
    for name in GLOO_NAMES.get(kind, ()):
        for i, ann in enumerate(pool.get(name, [])):
            if ann["ts"] < e["ts"]:
                continue
            try:
                have = numel((ann.get("args", {}).get("Input Dims") or [None])[0])
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
            args_from = e
            if trace.layout == "L2" and "Input Dims" not in e.get("args", {}):
                args_from = _with_enclosing_args(trace, e)
            ann = _take_annotation(pool, kind, e) if pool else None
            call = _dims_call(trace, args_from, kind, ann)
            if call is not None and ann is not None:
                call.done_us = float(ann["ts"]) + float(ann.get("dur", 0))
                if ann.get("tid") != e.get("tid"):  # a collective on its group's worker
                    call.lane = ann.get("tid")
        if call is not None:
            call.done_us = kernel_end.get(id(e), call.done_us)
            out.append(call)
    return out


def _enclosing_comms(trace: Trace, e: dict[str, Any]) -> dict[str, Any] | None:
    """L2: the innermost ``record_param_comms`` op on ``e``'s thread that was running when the
    ``nccl:`` annotation ``e`` started (NCCL ends the annotation when the work completes,
    after the op has returned, so only its start lies inside)."""
    best = None
    for o in trace.events:
        if o["name"] == "record_param_comms" and o.get("tid") == e.get("tid") and on_host(o) \
                and o["ts"] <= e["ts"] <= float(o["ts"]) + float(o.get("dur", 0)) \
                and (best is None or o["ts"] >= best["ts"]):
            best = o
    return best


def _with_enclosing_args(trace: Trace, e: dict[str, Any]) -> dict[str, Any]:
    """L2: an ``nccl:`` annotation with the arguments of its ``record_param_comms`` op."""
    o = _enclosing_comms(trace, e)
    return {**e, "args": {**o.get("args", {}), **e.get("args", {})}} if o else e


def _external_id(e: dict[str, Any]) -> Any:
    a = e.get("args", {})
    return a.get("External id", a.get("external id"))


def _nccl_kernel_ends(trace: Trace, comm: list[dict[str, Any]]) -> dict[int, float]:
    """L1-GPU, L2-GPU: the end of each call's NCCL kernel, by ``id`` of the call's event. A
    kernel whose ``External id`` is the call's (or, L2, its ``record_param_comms`` op's) is
    the call's; otherwise the ``k``-th kernel of a process group belongs to that group's
    ``k``-th call."""
    kernels: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_ext: dict[Any, dict[str, Any]] = {}
    for e in sorted(trace.events, key=lambda e: e["ts"]):
        if e.get("cat") == "kernel" and e["name"].startswith(NCCL_KERNEL_PREFIXES):
            kernels[str(e.get("args", {}).get("Process Group Name", ""))].append(e)
            if _external_id(e) is not None:
                by_ext[_external_id(e)] = e  # the last one (coalesced launches) ends the call
    out: dict[int, float] = {}
    taken: dict[str, int] = defaultdict(int)
    linked = set()
    for e in comm:
        ids = [_external_id(e)]
        if trace.layout == "L2" and (o := _enclosing_comms(trace, e)) is not None:
            ids.append(_external_id(o))
        kern = next((by_ext[i] for i in ids if i is not None and i in by_ext), None)
        if kern is not None:
            out[id(e)] = float(kern["ts"]) + float(kern.get("dur", 0))
            linked.add(id(kern))
    for e in comm:
        if id(e) in out:
            continue
        key = str(e.get("args", {}).get("Process Group Name", ""))
        key = key if key in kernels else ""
        free = [k for k in kernels.get(key, []) if id(k) not in linked]
        if taken[key] < len(free):
            kern = free[taken[key]]
            out[id(e)] = float(kern["ts"]) + float(kern.get("dur", 0))
            taken[key] += 1
    return out


