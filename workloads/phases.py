"""Phases: consecutive collectives of one parallelism axis on one rank.

Following the paper (§3.1), a phase is a run of communication of one parallelism between two
windows. Concretely, walking a rank's ops in issue order and looking only at collectives that
need the rails (``scale_up`` ones ride NVLink and are skipped unless asked for), a new phase
starts whenever the paper-level axis (``dp``, ``pp``, ``tp``, ``cp``, ``ep``; FSDP and expert-DP
traffic count as ``dp``) or the kind of collective (``allgather``, ``reducescatter``,
``allreduce``, ``sendrecv``, ``alltoall``) changes. Compute between collectives does not split
a phase; ``axes`` names the group axes it holds (``fsdp`` for FSDP's calls, ``fsdp+dp`` for
HSDP's), as the ``workload`` command prints them. Each phase lists its comm groups and the
circuits it needs per rail: ring neighbours for ring collectives, the pair for send/recv,
every pair for all-to-all, as unordered rank pairs on the rail (ports are the controller's
business).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workloads.layout import Circuits
from workloads.schedule import Op, Schedule

KIND_FAMILY = {"all_gather": "allgather", "reduce_scatter": "reducescatter",
               "all_reduce": "allreduce", "send": "sendrecv", "recv": "sendrecv",
               "all_to_all": "alltoall"}


@dataclass
class Phase:
    """A run of same-axis, same-kind collectives of one rank."""

    rank: int
    axis: str
    kind: str
    scale_up: bool
    op_indices: list[int] = field(default_factory=list)
    collective_ids: list[str] = field(default_factory=list)
    group_ids: list[str] = field(default_factory=list)
    message_bytes: int = 0
    wire_bytes: int = 0
    max_call_bytes: int = 0
    circuits: Circuits = field(default_factory=dict)
    axes: list[str] = field(default_factory=list)  # the ops' own axes, in order seen

    def add(self, op: Op, circuits: Circuits) -> None:
        if op.axis not in self.axes:
            self.axes.append(op.axis)
        self.op_indices.append(op.index)
        self.collective_ids.append(op.collective_id)
        if op.group_id not in self.group_ids:
            self.group_ids.append(op.group_id)
        self.message_bytes += op.size_bytes
        self.wire_bytes += op.wire_bytes
        self.max_call_bytes = max(self.max_call_bytes, op.size_bytes)
        for rail, pairs in circuits.items():
            merged = set(self.circuits.get(rail, [])) | set(pairs)
            self.circuits[rail] = sorted(merged)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "axis": self.axis, "axes": self.axes, "kind": self.kind,
            "scale_up": self.scale_up,
            "calls": len(self.op_indices), "op_indices": self.op_indices,
            "collective_ids": self.collective_ids, "group_ids": self.group_ids,
            "message_bytes": self.message_bytes, "wire_bytes": self.wire_bytes,
            "max_call_bytes": self.max_call_bytes,
            "circuits": {str(r): [list(p) for p in v] for r, v in self.circuits.items()},
        }


def phases_of(schedule: Schedule, rank: int, include_scale_up: bool = False) -> list[Phase]:
    """Phases of ``rank`` in issue order."""
    out: list[Phase] = []
    cache: dict[tuple[str, str, int], Circuits] = {}
    for op in schedule.ops_of(rank):
        if not op.is_collective or (op.scale_up and not include_scale_up):
            continue
        kind = KIND_FAMILY[op.kind]
        cur = out[-1] if out else None
        if cur is None or (cur.axis, cur.kind, cur.scale_up) != (op.family, kind, op.scale_up):
            cur = Phase(rank, op.family, kind, op.scale_up)
            out.append(cur)
        key = (op.group_id, op.kind, op.peer)
        if key not in cache:
            cache[key] = schedule.op_circuits(op)
        cur.add(op, cache[key])
    return out
