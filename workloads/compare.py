"""Two schedules side by side, per rank: phases, PP<->DP boundaries, bytes, and every difference.

Typical use: a generated schedule against a captured or imported one of the same job
(``opus-testbed workload compare tiny.yaml capture/workload.json``), or one job with two
options (reshard after forward or not). Per rank:

* its **phases** (:mod:`workloads.phases`, intra-server ones included and marked): axis family,
  kind, calls, message and wire bytes;
* its **PP<->DP boundaries**: consecutive phase pairs whose families are ``pp`` and ``dp``, the
  points where a photonic rail must switch between pipeline and data-parallel circuits; within
  the iteration, and cyclic (the iteration's last phase followed by its first, as a run of
  iterations sees it: where a capture cuts a step changes the first figure, not the second);
* its compute time, shown but never counted as a difference (a generated schedule's compute is
  modelled from FLOPs, a captured one's measured);
* its **differences**: the two phase sequences are aligned on (family, kind, scale-up) with
  :class:`difflib.SequenceMatcher`; aligned phases are compared on calls and bytes, phases
  present on one side only are listed as such.

Pure: no I/O beyond what :func:`load_any` reads.
"""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workloads.errors import WorkloadConfigError
from workloads.phases import phases_of
from workloads.schedule import Schedule

MIB = 2**20
PHASE_FIELDS = ("calls", "message_bytes", "wire_bytes")


@dataclass(frozen=True)
class PhaseRow:
    """The comparable summary of one phase."""

    axis: str
    kind: str
    scale_up: bool
    calls: int
    message_bytes: int
    wire_bytes: int

    @property
    def key(self) -> tuple[str, str, bool]:
        return self.axis, self.kind, self.scale_up

    @property
    def label(self) -> str:
        return f"{self.axis} {self.kind}{' (scale-up)' if self.scale_up else ''}"

    def to_json(self) -> dict[str, Any]:
        return {"axis": self.axis, "kind": self.kind, "scale_up": self.scale_up,
                "calls": self.calls, "message_bytes": self.message_bytes,
                "wire_bytes": self.wire_bytes}


def load_any(path: str | Path) -> Schedule:
    """A schedule from a schedule JSON file, or from an experiment file (generated or loaded)."""
    p = Path(path)
    if p.suffix == ".json":
        from workloads.schedule import load

        return load(p)
    from workloads.loader import load_workload_source

    return load_workload_source(p).schedule()


def phase_rows(schedule: Schedule, rank: int) -> list[PhaseRow]:
    """``rank``'s phases, intra-server ones included."""
    return [PhaseRow(p.axis, p.kind, p.scale_up, len(p.op_indices), p.message_bytes,
                     p.wire_bytes) for p in phases_of(schedule, rank, include_scale_up=True)]


def compute_s(schedule: Schedule, rank: int) -> float:
    """Total compute of ``rank`` (shown, never a difference: generated compute is modelled)."""
    return sum(op.duration_s for op in schedule.ops_of(rank) if not op.is_collective)


def boundaries(rows: list[PhaseRow], cyclic: bool = False) -> int:
    """Consecutive phase pairs whose families are pp and dp (either order); ``cyclic`` also
    counts the last phase followed by the first (the next iteration's)."""
    pairs = itertools.pairwise(rows + rows[:1] if cyclic and len(rows) > 1 else rows)
    return sum({a.axis, b.axis} == {"pp", "dp"} for a, b in pairs)


def differences(a: list[PhaseRow], b: list[PhaseRow]) -> list[dict[str, Any]]:
    """Every difference between two phase sequences (see the module docstring)."""
    out: list[dict[str, Any]] = []
    matcher = difflib.SequenceMatcher(None, [r.key for r in a], [r.key for r in b],
                                      autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2), strict=True):
                for name in PHASE_FIELDS:
                    va, vb = getattr(a[i], name), getattr(b[j], name)
                    if va != vb:
                        out.append({"change": "changed", "a_phase": i, "b_phase": j,
                                    "phase": a[i].label, "field": name, "a": va, "b": vb})
            continue
        out.extend({"change": "only_a", "a_phase": i, "phase": a[i].label,
                    "calls": a[i].calls, "message_bytes": a[i].message_bytes}
                   for i in range(i1, i2))
        out.extend({"change": "only_b", "b_phase": j, "phase": b[j].label,
                    "calls": b[j].calls, "message_bytes": b[j].message_bytes}
                   for j in range(j1, j2))
    return out


def compare(a: Schedule, b: Schedule, ranks: list[int] | None = None) -> dict[str, Any]:
    """The per-rank comparison of two schedules of the same world size (JSON-able)."""
    if a.world_size != b.world_size:
        raise WorkloadConfigError(f"the schedules have {a.world_size} and {b.world_size} "
                                  "ranks; compare schedules of one world size")
    ranks = list(range(a.world_size)) if ranks is None else ranks
    for r in ranks:
        if not 0 <= r < a.world_size:
            raise WorkloadConfigError(f"rank {r} is not in 0..{a.world_size - 1}", "--rank")
    out: dict[str, Any] = {}
    for r in ranks:
        pa, pb = phase_rows(a, r), phase_rows(b, r)
        out[str(r)] = {"a": [p.to_json() for p in pa], "b": [p.to_json() for p in pb],
                       "boundaries": {"a": boundaries(pa), "b": boundaries(pb)},
                       "boundaries_cyclic": {"a": boundaries(pa, cyclic=True),
                                             "b": boundaries(pb, cyclic=True)},
                       "compute_s": {"a": compute_s(a, r), "b": compute_s(b, r)},
                       "differences": differences(pa, pb)}
    return {"world_size": a.world_size, "ranks": out,
            "equal": not any(v["differences"] or v["boundaries"]["a"] != v["boundaries"]["b"]
                             for v in out.values())}


def render(report: dict[str, Any], name_a: str, name_b: str) -> str:
    """The human form of :func:`compare`: ranks with the same picture are shown once."""
    lines = [f"A: {name_a}", f"B: {name_b}"]
    same: dict[str, list[str]] = {}
    for rank, v in report["ranks"].items():
        key = repr((v["a"], v["b"], v["boundaries"], v["differences"]))  # compute aside
        same.setdefault(key, []).append(rank)
    for ranks in same.values():
        v = report["ranks"][ranks[0]]
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(ranks)}"
        bd, cy, cs = v["boundaries"], v["boundaries_cyclic"], v["compute_s"]
        lines.append(f"\n{who}: {len(v['a'])} phases in A, {len(v['b'])} in B; PP<->DP "
                     f"boundaries per iteration: A {bd['a']}, B {bd['b']} (cyclic: A {cy['a']}, "
                     f"B {cy['b']}); compute "
                     f"A {cs['a'] * 1e3:.3f} ms, B {cs['b'] * 1e3:.3f} ms (rank {ranks[0]})")
        lines.append(f"  {'#':>3} {'A phase':24} {'calls':>5} {'MiB':>8}   {'B phase':24} "
                     f"{'calls':>5} {'MiB':>8}")
        for k in range(max(len(v["a"]), len(v["b"]))):
            cells = []
            for side in (v["a"], v["b"]):
                if k < len(side):
                    p = side[k]
                    name = f"{p['axis']} {p['kind']}{' (su)' if p['scale_up'] else ''}"
                    cells.append(f"{name:24} {p['calls']:>5} {p['message_bytes'] / MIB:>8.3f}")
                else:
                    cells.append(" " * 39)
            lines.append(f"  {k:>3} {cells[0]}   {cells[1]}")
        diffs = v["differences"]
        lines.append(f"  differences: {len(diffs) or 'none'}")
        for d in diffs:
            lines.append("    " + describe(d))
    lines.append("\nschedules agree" if report["equal"] else "\nschedules differ")
    return "\n".join(lines)


def describe(d: dict[str, Any]) -> str:
    """One difference as a sentence."""
    if d["change"] == "changed":
        return (f"A phase {d['a_phase']} / B phase {d['b_phase']} ({d['phase']}): {d['field']} "
                f"{d['a']} in A, {d['b']} in B")
    side, idx = ("A", d["a_phase"]) if d["change"] == "only_a" else ("B", d["b_phase"])
    return (f"only in {side}: phase {idx} ({d['phase']}, {d['calls']} calls, "
            f"{d['message_bytes']} B)")
