"""Rank layout on the device mesh and the communication groups of every axis.

Mesh, outermost to innermost: ``[pp, dp, fsdp, cp, tp]``, so
``rank = (((pp_i * dp + dp_i) * fsdp + fsdp_i) * cp + cp_i) * tp + tp_i``.
With ``tp`` dividing ``gpus_per_server`` a TP group always sits inside one server.

Groups per axis (each axis's groups partition the ranks; a degree-1 axis has one singleton
group per rank):

* ``tp``, ``cp``, ``pp``: the ranks that differ only in that coordinate.
* ``fsdp``: the ZeRO-3 shard group, ranks differing in ``fsdp`` and ``cp`` (TorchTitan shards
  over ``dp_shard x cp`` because CP ranks hold the same parameters).
* ``dp``: gradient replicas. With FSDP it is the HSDP replicate dimension (``dp`` only); with
  plain DDP it spans ``dp x cp``, the ranks whose gradients DDP averages.
* ``ep``: the data-parallel index ``d = dp_i * fsdp + fsdp_i`` is split as
  ``d = outer * ep + inner``; an EP group is the ``ep`` ranks differing in ``inner``.
* ``edp``: expert-data-parallel replicas of the same experts, differing in ``outer`` and ``cp``
  (Megatron-LM's expert data parallel group).

Ring order inside a group is row-major order of the varying coordinates. Group ids are
``f"{axis}{index}"`` with ``index`` the row-major order of the fixed coordinates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from workloads.hardware import Cluster
from workloads.parallel import ParallelConfig

AXES = ("tp", "cp", "fsdp", "dp", "ep", "edp", "pp")
# Paper-level axis family of each group axis (FSDP and expert-DP traffic is "DP" traffic).
AXIS_FAMILY = {"tp": "tp", "cp": "cp", "fsdp": "dp", "dp": "dp", "ep": "ep", "edp": "dp",
               "pp": "pp"}


@dataclass(frozen=True, eq=False)
class GroupSet:
    """All communication groups of one axis: ``ranks[g]`` lists group ``g`` in ring order."""

    axis: str
    ranks: np.ndarray  # shape (n_groups, size), int64

    @property
    def size(self) -> int:
        return int(self.ranks.shape[1])

    @property
    def n_groups(self) -> int:
        return int(self.ranks.shape[0])

    def group_id(self, index: int) -> str:
        return f"{self.axis}{index}"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, GroupSet) and self.axis == other.axis
                and np.array_equal(self.ranks, other.ranks))

    def __hash__(self) -> int:
        return hash((self.axis, self.ranks.shape))


def mesh_view(p: ParallelConfig) -> np.ndarray:
    """Ranks as an array of shape ``(pp, dp, fsdp, cp, tp)``."""
    return np.arange(p.world_size, dtype=np.int64).reshape(p.pp, p.dp, p.fsdp, p.cp, p.tp)


def _groups(view: np.ndarray, varying: tuple[int, ...]) -> np.ndarray:
    fixed = tuple(i for i in range(view.ndim) if i not in varying)
    size = int(np.prod([view.shape[i] for i in varying])) if varying else 1
    return np.ascontiguousarray(view.transpose(fixed + varying).reshape(-1, size))


def build_groups(p: ParallelConfig) -> dict[str, GroupSet]:
    """The group set of every axis in :data:`AXES`."""
    view = mesh_view(p)
    out = {
        "tp": _groups(view, (4,)),
        "cp": _groups(view, (3,)),
        "pp": _groups(view, (0,)),
        "fsdp": _groups(view, (2, 3)),
        "dp": _groups(view, (1,)) if p.fsdp > 1 else _groups(view, (1, 3)),
    }
    # Split the data-parallel index into (outer, inner=ep): shape (pp, D/ep, ep, cp, tp).
    ep_view = view.reshape(p.pp, p.data_parallel // p.ep, p.ep, p.cp, p.tp)
    out["ep"] = _groups(ep_view, (2,))
    out["edp"] = _groups(ep_view, (1, 3))
    return {axis: GroupSet(axis, out[axis]) for axis in AXES}


@dataclass(frozen=True)
class RankIndex:
    """For one axis: the group index and ring position of every rank."""

    group: np.ndarray
    position: np.ndarray


def index_groups(gs: GroupSet, world_size: int) -> RankIndex:
    """Invert a group set: rank -> (group index, ring position)."""
    group = np.empty(world_size, dtype=np.int64)
    position = np.empty(world_size, dtype=np.int64)
    flat = gs.ranks.reshape(-1)
    group[flat] = np.repeat(np.arange(gs.n_groups), gs.size)
    position[flat] = np.tile(np.arange(gs.size), gs.n_groups)
    return RankIndex(group, position)


def scale_up_mask(gs: GroupSet, cluster: Cluster) -> np.ndarray:
    """True for groups whose ranks all sit in one server (no rail circuit needed)."""
    servers = gs.ranks // cluster.gpus_per_server
    return np.all(servers == servers[:, :1], axis=1)


Circuits = dict[int, list[tuple[int, int]]]


def hop_circuit(src: int, dst: int, cluster: Cluster) -> tuple[int, tuple[int, int]] | None:
    """The rail circuit carrying a transfer ``src -> dst``, or None inside a server.

    Same rail: the pair itself. Different rails: the data crosses the scale-up domain to the
    GPU of the source server on the destination's rail first (NVIDIA's PXN), so the circuit is
    (that proxy, dst) on the destination's rail.
    """
    gps = cluster.gpus_per_server
    if src // gps == dst // gps:
        return None
    rail = dst % gps
    a = src if src % gps == rail else (src // gps) * gps + rail
    return rail, (min(a, dst), max(a, dst))


def pair_circuits(pairs: list[tuple[int, int]], cluster: Cluster) -> Circuits:
    """Circuits per rail for directed transfers, as sorted unordered rank pairs."""
    by_rail: dict[int, set[tuple[int, int]]] = {}
    for src, dst in pairs:
        hop = hop_circuit(src, dst, cluster)
        if hop is not None:
            by_rail.setdefault(hop[0], set()).add(hop[1])
    return {rail: sorted(v) for rail, v in sorted(by_rail.items())}


def ring_circuits(ring: Sequence[int] | np.ndarray, cluster: Cluster) -> Circuits:
    """Circuits per rail of a ring over ``ring`` (neighbour pairs, closing hop included)."""
    r = [int(x) for x in ring]
    if len(r) < 2:
        return {}
    hops = [(r[i], r[(i + 1) % len(r)]) for i in range(len(r))]
    return pair_circuits(hops, cluster)


def mesh_circuits(ranks: Sequence[int] | np.ndarray, cluster: Cluster) -> Circuits:
    """Circuits per rail for an all-to-all: every pair of the group."""
    r = [int(x) for x in ranks]
    return pair_circuits([(a, b) for i, a in enumerate(r) for b in r[i + 1:]], cluster)
