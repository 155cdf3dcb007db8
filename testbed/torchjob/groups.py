"""A torch job's process groups as Opus comm groups (pure).

A torch script creates its groups at run time (``init_process_group``, ``new_group``, a
``DeviceMesh``), so the groups are not in the experiment file: the loopback reference run
observes them, and its call records give the job Opus registers before the rails run.

* A group's **axis** comes from its torch descriptor: ``mesh_<dim>`` (a ``DeviceMesh``
  dimension) gives ``<dim>``, with ``replicate`` read as ``dp`` and ``shard`` as ``fsdp``
  (HSDP's names); ``default_pg`` is ``world``; an ``axes`` map from the experiment overrides.
* Its **lane** (the Opus comm group id, one lane thread per id in each rank) is the axis and
  the members in group order, ``fsdp0-1``; point-to-point calls run on the pair's lane
  ``p2p<lo>-<hi>``, as replayed pipelines do (:func:`testbed.plan.replay.pair_group_id`).
  Both are computed locally by every rank, identically in the reference and the rails run.
* A group whose members share a server is **scale-up** (NVLink in a real cluster): not Opus's
  business, so it is left out of the job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.job import CommGroup
from testbed.plan.replay import pair_group_id

P2P_OPS = ("send", "recv")
HSDP_NAMES = {"replicate": "dp", "shard": "fsdp"}


class GroupError(ValueError):
    """A group the rails cannot carry; the message names it, its members and its first call."""


def axis_of(desc: str, axes: Mapping[str, str] | None = None) -> str:
    """The parallelism axis of a torch group descriptor (see the module docstring)."""
    if axes and desc in axes:
        return axes[desc]
    if desc == "default_pg":
        return "world"
    if desc.startswith("mesh_"):
        dim = desc.removeprefix("mesh_")
        return HSDP_NAMES.get(dim, dim)
    word = re.sub(r"[^A-Za-z_]", "", desc)
    return word or "group"


def collective_lane(axis: str, members: Iterable[int]) -> str:
    """The lane (Opus group id) of a collective on a group: ``f"{axis}{m0}-{m1}-..."``."""
    return axis + "-".join(str(m) for m in members)


def p2p_lane(rank: int, peer: int) -> str:
    """The lane of a send or receive between ``rank`` and ``peer``."""
    return pair_group_id(rank, peer)


def is_scale_up(members: Iterable[int], gpus_per_server: int) -> bool:
    """True when every member sits on one server (the traffic never needs a rail)."""
    return len({m // gpus_per_server for m in members}) <= 1


@dataclass(frozen=True)
class ObservedGroup:
    """A lane as the reference run used it: members (ring order), axis, pattern, first use."""

    lane: str
    axis: str
    members: tuple[int, ...]
    pattern: str  # "ring" | "pairs"
    first_call: str

    def comm_group(self) -> CommGroup:
        return CommGroup(self.lane, self.axis, self.members, self.pattern)


def observed_groups(records: Iterable[Mapping[str, Any]]) -> dict[str, ObservedGroup]:
    """Every lane the call records name, with its members; refuses records that disagree."""
    out: dict[str, ObservedGroup] = {}
    for r in records:
        if r.get("ev") != "call":
            continue
        lane = str(r["lane"])
        if r["op"] in P2P_OPS:
            members: tuple[int, ...] = tuple(sorted((int(r["rank"]), int(r["peer"]))))
            pattern = "pairs"
        else:
            members, pattern = tuple(int(m) for m in r["members"]), "ring"
        group = ObservedGroup(lane, str(r["axis"]), members, pattern,
                              f"rank {r['rank']}'s {r['op']} on torch group "
                              f"{r.get('torch_group', '?')}")
        seen = out.setdefault(lane, group)
        if (seen.members, seen.pattern) != (members, pattern):
            raise GroupError(f"lane {lane}: {group.first_call} has members {list(members)}, "
                             f"but {seen.first_call} had {list(seen.members)}")
    return out


def rail_groups(observed: Mapping[str, ObservedGroup], *, gpus_per_server: int,
                rail_of: Callable[[int], int]) -> dict[str, CommGroup]:
    """The Opus comm groups of a job: the lanes that need the rails.

    Scale-up lanes are left out; a lane whose neighbours (ring order, or the pair) sit on
    different rails is refused, since rails are not joined to each other.
    """
    out: dict[str, CommGroup] = {}
    for lane, g in sorted(observed.items()):
        if is_scale_up(g.members, gpus_per_server):
            continue
        m = g.members
        hops = zip(m, m[1:] + m[:1], strict=True) if g.pattern == "ring" else [(m[0], m[-1])]
        for a, b in hops:
            if a != b and rail_of(a) != rail_of(b):
                raise GroupError(
                    f"group {lane} (members {list(m)}, first used by {g.first_call}) joins "
                    f"ranks {a} and {b} on rails {rail_of(a)} and {rail_of(b)}; a group must "
                    "stay on one rail or inside one server")
        out[lane] = g.comm_group()
    return out
