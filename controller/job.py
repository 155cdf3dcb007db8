"""Jobs as the Opus controller sees them: ranks with their rail ports, and comm groups.

A job is registered with the controller before its ranks connect. Topology conventions
(rail-optimized cluster, ``G`` GPUs per server, ``R`` rails, ``K`` ports per rank and rail):

* rank ``r`` sits on server ``s = r // G`` with local index ``r % G``; its rail is
  ``(r % G) % R``;
* on its rail, rank ``r`` owns ports ``slot*K + k + 1`` for ``k in range(K)``, where
  ``slot = s * ceil(G / R) + (r % G) // R`` (with one rail per GPU index, ``slot = s``; with
  fewer rails, the local GPUs that share a rail each get their own block of K ports).
  :func:`rank_rail_ports` is the one implementation, used by every backend.

A comm group's circuit demand is a set of rank pairs per rail: a ring joins consecutive members
in ring order (members on different rails reach each other through the scale-up domain, so each
rail gets the ring of its own members, in the same order); ``pairs`` joins members two by two
(send/recv); explicit ``pairs`` override both. Everything here is pure data with validation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

GROUP_KINDS = ("ring", "pairs")

Edge = tuple[int, int]  # a rank pair (low, high)


class JobError(ValueError):
    """A job description that the controller cannot accept; the message names the problem."""


def _edge(a: int, b: int) -> Edge:
    return (a, b) if a < b else (b, a)


@dataclass(frozen=True)
class CommGroup:
    """A communication group: ranks in ring order, the parallelism axis and the pattern."""

    group_id: str
    axis: str
    ranks: tuple[int, ...]
    kind: str = "ring"
    pairs: tuple[Edge, ...] | None = None  # explicit rank-pair demand; overrides ``kind``

    def __post_init__(self) -> None:
        if not self.group_id:
            raise JobError("a comm group needs a non-empty id")
        if self.kind not in GROUP_KINDS:
            raise JobError(f"group {self.group_id}: kind must be one of {GROUP_KINDS}, "
                           f"got {self.kind!r}")
        if len(set(self.ranks)) != len(self.ranks) or not self.ranks:
            raise JobError(f"group {self.group_id}: ranks must be distinct and non-empty, "
                           f"got {list(self.ranks)}")
        if self.pairs is not None:
            members = set(self.ranks)
            for a, b in self.pairs:
                if a == b or a not in members or b not in members:
                    raise JobError(f"group {self.group_id}: pair ({a}, {b}) must join two "
                                   f"distinct members")

    def demand(self, rail_of: Mapping[int, int]) -> dict[int, frozenset[Edge]]:
        """Rank pairs that need a circuit, per rail (``rail_of`` maps rank -> rail)."""
        out: dict[int, set[Edge]] = {}
        if self.pairs is not None:
            for a, b in self.pairs:
                if rail_of[a] != rail_of[b]:
                    raise JobError(f"group {self.group_id}: pair ({a}, {b}) spans rails "
                                   f"{rail_of[a]} and {rail_of[b]}")
                out.setdefault(rail_of[a], set()).add(_edge(a, b))
        elif self.kind == "pairs":
            for i in range(0, len(self.ranks) - 1, 2):
                a, b = self.ranks[i], self.ranks[i + 1]
                if rail_of[a] != rail_of[b]:
                    raise JobError(f"group {self.group_id}: pair ({a}, {b}) spans rails "
                                   f"{rail_of[a]} and {rail_of[b]}")
                out.setdefault(rail_of[a], set()).add(_edge(a, b))
        else:
            by_rail: dict[int, list[int]] = {}
            for r in self.ranks:
                by_rail.setdefault(rail_of[r], []).append(r)
            for rail, ring in by_rail.items():
                if len(ring) < 2:
                    continue
                n = len(ring)
                edges = {_edge(ring[i], ring[(i + 1) % n]) for i in range(n)}
                out[rail] = edges
        return {rail: frozenset(e) for rail, e in out.items() if e}

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {"id": self.group_id, "axis": self.axis,
                                   "ranks": list(self.ranks), "kind": self.kind}
        if self.pairs is not None:
            data["pairs"] = [list(p) for p in self.pairs]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> CommGroup:
        try:
            ranks = data["ranks"]
            if not isinstance(ranks, list) or not all(_is_int(r) for r in ranks):
                raise JobError(f"group {data.get('id')!r}: 'ranks' must be a list of integers")
            pairs_raw = data.get("pairs")
            pairs: tuple[Edge, ...] | None = None
            if pairs_raw is not None:
                if not isinstance(pairs_raw, list) or not all(
                    isinstance(p, list | tuple) and len(p) == 2 and all(_is_int(x) for x in p)
                    for p in pairs_raw
                ):
                    raise JobError(f"group {data.get('id')!r}: 'pairs' must be [rank, rank] pairs")
                pairs = tuple((int(p[0]), int(p[1])) for p in pairs_raw)
            return cls(str(data["id"]), str(data.get("axis", "")), tuple(int(r) for r in ranks),
                       str(data.get("kind", "ring")), pairs)
        except KeyError as exc:
            raise JobError(f"comm group is missing field {exc}") from exc


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class RankPorts:
    """The rail a rank sits on and the ports it owns there (its K-port budget)."""

    rank: int
    rail: int
    ports: tuple[int, ...]


def rank_rail_ports(rank: int, gpus_per_server: int, ports_per_rank: int,
                    rails: int | None = None) -> RankPorts:
    """Rank ``rank``'s rail and its K ports there (the numbering of the module docstring)."""
    n_rails = rails or gpus_per_server
    server, local = divmod(rank, gpus_per_server)
    slot = server * -(-gpus_per_server // n_rails) + local // n_rails
    return RankPorts(rank, local % n_rails,
                     tuple(slot * ports_per_rank + k + 1 for k in range(ports_per_rank)))


@dataclass(frozen=True)
class SpareSlot:
    """A spare GPU: dark until it takes over a failed rank on its rail.

    ``server`` is the server it sits in (``servers`` and above for the spare servers); its K
    ports on ``rail`` follow every rank's ports there (:func:`spare_slots`).
    """

    index: int
    server: int
    rail: int
    ports: tuple[int, ...]


def spare_slots(servers: int, gpus_per_server: int, ports_per_rank: int, rails: int | None = None,
                *, spares_per_server: int = 0, spare_servers: int = 0) -> list[SpareSlot]:
    """The spare GPUs of a cluster and their rail ports, in spare-index order.

    Spare ``j`` of a server sits at local index ``gpus_per_server + j`` and so on rail
    ``j % R`` (a GPU's NIC is on one rail); a spare server holds ``gpus_per_server`` spares laid
    out as a server's GPUs. On each rail the spares' ports come after the ranks' (which end at
    port ``servers * ceil(G / R) * K``), in spare order, K per spare.
    """
    n_rails = rails or gpus_per_server
    per_rail_slots = servers * -(-gpus_per_server // n_rails)
    placed: list[tuple[int, int]] = [(s, j % n_rails) for s in range(servers)
                                     for j in range(spares_per_server)]
    placed += [(servers + t, i % n_rails) for t in range(spare_servers)
               for i in range(gpus_per_server)]
    used: dict[int, int] = {}
    out = []
    for index, (server, rail) in enumerate(placed):
        slot = per_rail_slots + used.get(rail, 0)
        used[rail] = used.get(rail, 0) + 1
        out.append(SpareSlot(index, server, rail,
                             tuple(slot * ports_per_rank + k + 1 for k in range(ports_per_rank))))
    return out


def rail_job_ports(ranks: Iterable[int], gpus_per_server: int, ports_per_rank: int,
                   rails: int | None = None) -> dict[int, RankPorts]:
    """:func:`rank_rail_ports` of each of ``ranks``."""
    return {r: rank_rail_ports(r, gpus_per_server, ports_per_rank, rails) for r in ranks}


@dataclass(frozen=True)
class JobSpec:
    """A registered job: its ranks' rail ports and its comm groups, validated on creation."""

    job_id: str
    ranks: Mapping[int, RankPorts]
    groups: Mapping[str, CommGroup]
    #: rank -> pipeline stage, when known (``ocs.semantics: rail-state`` needs it)
    stages: Mapping[int, int] | None = field(default=None, compare=False)
    demand: Mapping[str, Mapping[int, frozenset[Edge]]] = field(init=False, repr=False,
                                                                compare=False)

    def __post_init__(self) -> None:
        if not self.job_id:
            raise JobError("a job needs a non-empty id")
        owner: dict[tuple[int, int], int] = {}
        for r, rp in self.ranks.items():
            if r != rp.rank:
                raise JobError(f"job {self.job_id}: rank key {r} != rank {rp.rank}")
            if not rp.ports:
                raise JobError(f"job {self.job_id}: rank {r} owns no ports")
            for p in rp.ports:
                if (rp.rail, p) in owner:
                    raise JobError(f"job {self.job_id}: rail {rp.rail} port {p} claimed by "
                                   f"ranks {owner[(rp.rail, p)]} and {r}")
                owner[(rp.rail, p)] = r
        rail_of = {r: rp.rail for r, rp in self.ranks.items()}
        demand: dict[str, dict[int, frozenset[Edge]]] = {}
        for gid, g in self.groups.items():
            if gid != g.group_id:
                raise JobError(f"job {self.job_id}: group key {gid!r} != id {g.group_id!r}")
            unknown = [r for r in g.ranks if r not in self.ranks]
            if unknown:
                raise JobError(f"job {self.job_id}: group {gid} names ranks {unknown} "
                               f"that are not in the job")
            d = g.demand(rail_of)
            for rail, edges in d.items():
                degree: dict[int, int] = {}
                for a, b in edges:
                    degree[a] = degree.get(a, 0) + 1
                    degree[b] = degree.get(b, 0) + 1
                for r, deg in degree.items():
                    k = len(self.ranks[r].ports)
                    if deg > k:
                        raise JobError(
                            f"job {self.job_id}: group {gid} needs {deg} circuits at rank {r} "
                            f"on rail {rail} but the rank owns {k} port(s) there"
                        )
            demand[gid] = d
        object.__setattr__(self, "demand", demand)
        if self.stages is not None and set(self.stages) != set(self.ranks):
            raise JobError(f"job {self.job_id}: stages must name every rank and no other")

    @property
    def ports_by_rail(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for rp in self.ranks.values():
            out.setdefault(rp.rail, set()).update(rp.ports)
        return out

    @classmethod
    def rail_optimized(
        cls,
        job_id: str,
        n_ranks: int,
        gpus_per_server: int,
        ports_per_rank: int,
        groups: Iterable[CommGroup],
        n_rails: int | None = None,
        first_rank: int = 0,
        stages: Mapping[int, int] | None = None,
    ) -> JobSpec:
        """Build a job with the standard rail mapping (see the module docstring)."""
        ranks = rail_job_ports(range(first_rank, first_rank + n_ranks), gpus_per_server,
                               ports_per_rank, n_rails)
        return cls(job_id, ranks, {grp.group_id: grp for grp in groups}, stages)

    def to_json(self) -> dict[str, object]:
        stages = self.stages
        return {
            "id": self.job_id,
            "ranks": [{"rank": rp.rank, "rail": rp.rail, "ports": list(rp.ports)}
                      | ({"stage": stages[rp.rank]} if stages is not None else {})
                      for rp in sorted(self.ranks.values(), key=lambda x: x.rank)],
            "groups": [g.to_json() for g in self.groups.values()],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> JobSpec:
        """Parse the JSON form; raises :class:`JobError` naming the malformed field."""
        if not isinstance(data, Mapping):
            raise JobError("a job must be a JSON object")
        try:
            ranks_raw = data["ranks"]
            groups_raw = data["groups"]
            job_id = str(data["id"])
        except KeyError as exc:
            raise JobError(f"job is missing field {exc}") from exc
        if not isinstance(ranks_raw, list) or not isinstance(groups_raw, list):
            raise JobError("job 'ranks' and 'groups' must be lists")
        ranks: dict[int, RankPorts] = {}
        stages: dict[int, int] = {}
        for item in ranks_raw:
            if not isinstance(item, Mapping):
                raise JobError("each rank must be an object with rank, rail, ports")
            r, rail, ports = item.get("rank"), item.get("rail"), item.get("ports")
            if not _is_int(r) or not _is_int(rail) or not isinstance(ports, list) or not all(
                _is_int(p) for p in ports
            ):
                raise JobError(f"rank entry {dict(item)!r} needs integer rank, rail and ports")
            assert isinstance(r, int) and isinstance(rail, int)
            if r in ranks:
                raise JobError(f"job {job_id}: rank {r} listed twice")
            ranks[r] = RankPorts(r, rail, tuple(ports))
            if "stage" in item:
                stage = item["stage"]
                if not isinstance(stage, int) or isinstance(stage, bool) or stage < 0:
                    raise JobError(f"rank entry {dict(item)!r}: 'stage' must be an integer "
                                   ">= 0")
                stages[r] = stage
        groups: dict[str, CommGroup] = {}
        for item in groups_raw:
            if not isinstance(item, Mapping):
                raise JobError("each group must be an object")
            grp = CommGroup.from_json(item)
            if grp.group_id in groups:
                raise JobError(f"job {job_id}: group {grp.group_id} listed twice")
            groups[grp.group_id] = grp
        return cls(job_id, ranks, groups, stages or None)
