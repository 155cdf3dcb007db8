"""Fault injection and spare-GPU failover settings of an experiment (pure; both backends).

Layout in an experiment file::

    cluster: {servers: 4, gpus_per_server: 1, spares_per_server: 0, spare_servers: 1}
    faults:
      - {kind: kill, rank: 2, at_iteration: 3}       # the rank's process dies as iteration 3 starts
      - {kind: link_down, rank: 1, at_s: 2.5}         # its rail links go down (NIC watchdog)
      - {kind: hang, rank: 0, at_iteration: 2}        # the process stops: only heartbeats tell
      - {kind: port_failed, rail: 0, port: 3, at_iteration: 2}  # OCS port FAILED: no light,
                                                      # the switch refuses circuits on it
      - {kind: jitter, jitter_ms: 5}                  # switching delay +- 5 ms (from the start)
      - {kind: refuse, count: 1, at_iteration: 2}     # the OCS refuses the next reconfiguration
    failover:
      heartbeat_timeout_s: 5     # a silent shim is declared lost after this long
      migration_delay_s: 0       # --no-spares: every rank restarts after this delay
      repair_s: null             # a failed host rejoins the spare pool after this long

``at_iteration`` counts from 0 over warm-up and measured iterations; ``at_s`` is seconds after
the ranks started. A fault that takes a rank down (kill, link_down, hang, port_failed on a
rank's port) needs a spare on that rank's rail (:func:`controller.job.spare_slots`) unless the
run has ``--no-spares`` (every rank restarts from the last completed iteration instead) or
``failover.repair_s`` (failed hosts return to the pool). Everything a fault names is checked
against the cluster here, before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.job import SpareSlot, rank_rail_ports, spare_slots

FAULT_KINDS = ("kill", "link_down", "hang", "port_failed", "jitter", "refuse")
#: faults that take a rank out (its process, its NIC, or the OCS port its light goes through)
RANK_FAULTS = ("kill", "link_down", "hang")
FAULT_KEYS = ("kind", "rank", "rail", "port", "at_iteration", "at_s", "jitter_ms", "count")
FAILOVER_KEYS = ("heartbeat_timeout_s", "migration_delay_s", "repair_s")
#: keys each kind needs, and the keys it may have besides ``kind`` and its trigger
_REQUIRED = {"kill": ("rank",), "link_down": ("rank",), "hang": ("rank",),
             "port_failed": ("rail", "port"), "jitter": ("jitter_ms",), "refuse": ()}
_OPTIONAL = {"refuse": ("count",)}
#: kinds that must say when they happen (the others default to the start of the run)
_TIMED = ("kill", "link_down", "hang", "port_failed")


class FaultSpecError(ValueError):
    """A fault or failover setting that cannot be; ``field`` is its dotted path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Fault:
    """One injected fault; ``index`` is its place in the ``faults`` list."""

    kind: str
    index: int = 0
    rank: int | None = None
    rail: int | None = None
    port: int | None = None
    at_iteration: int | None = None
    at_s: float | None = None
    jitter_ms: float = 0.0
    count: int = 1
    position: str = ""  # file:line:column of the entry, for errors found after parsing

    @property
    def field(self) -> str:
        return f"faults[{self.index}]"

    def to_json(self) -> dict[str, Any]:
        """The entry as written in the file (what :func:`check_fault` takes)."""
        out: dict[str, Any] = {"kind": self.kind}
        for key in ("rank", "rail", "port", "at_iteration", "at_s"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.kind == "jitter":
            out["jitter_ms"] = self.jitter_ms
        if self.kind == "refuse":
            out["count"] = self.count
        return out


@dataclass(frozen=True)
class FailoverSettings:
    """How failures are detected and what replaces the failed rank."""

    heartbeat_timeout_s: float = 5.0
    migration_delay_s: float = 0.0
    repair_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"heartbeat_timeout_s": self.heartbeat_timeout_s,
                "migration_delay_s": self.migration_delay_s, "repair_s": self.repair_s}


@dataclass(frozen=True)
class ClusterShape:
    """What a fault may name: ranks, rails, ports (ranks' and spares'), iterations."""

    servers: int
    gpus_per_server: int
    ports_per_rank: int
    iterations: int
    spares_per_server: int = 0
    spare_servers: int = 0

    @property
    def world_size(self) -> int:
        return self.servers * self.gpus_per_server

    @property
    def spares(self) -> list[SpareSlot]:
        return spare_slots(self.servers, self.gpus_per_server, self.ports_per_rank,
                           spares_per_server=self.spares_per_server,
                           spare_servers=self.spare_servers)

    def port_owner(self, rail: int, port: int) -> tuple[str, int] | None:
        """``("rank", r)`` or ``("spare", j)`` owning ``port`` on ``rail``; None if none does."""
        for r in range(self.world_size):
            rp = rank_rail_ports(r, self.gpus_per_server, self.ports_per_rank)
            if rp.rail == rail and port in rp.ports:
                return ("rank", r)
        for s in self.spares:
            if s.rail == rail and port in s.ports:
                return ("spare", s.index)
        return None

    def rail_of(self, rank: int) -> int:
        return rank_rail_ports(rank, self.gpus_per_server, self.ports_per_rank).rail


def check_fault(raw: dict[str, Any], index: int, shape: ClusterShape, position: str = ""
                ) -> Fault:
    """A :class:`Fault` from one already-typed ``faults`` entry; raises :class:`FaultSpecError`."""
    path = f"faults[{index}]"
    kind = raw.get("kind")
    if kind not in FAULT_KINDS:
        raise FaultSpecError(f"{path}.kind", f"must be one of {', '.join(FAULT_KINDS)}, "
                             f"got {kind!r}")
    allowed = ("kind", "at_iteration", "at_s", *_REQUIRED[kind], *_OPTIONAL.get(kind, ()))
    for key in raw:
        if key not in allowed:
            raise FaultSpecError(f"{path}.{key}", f"a {kind} fault takes no {key!r}; allowed: "
                                 f"{', '.join(allowed)}")
    for key in _REQUIRED[kind]:
        if key not in raw:
            raise FaultSpecError(f"{path}.{key}", f"required for a {kind} fault")
    if "at_iteration" in raw and "at_s" in raw:
        raise FaultSpecError(f"{path}.at_s", "give at_iteration or at_s, not both")
    if kind in _TIMED and "at_iteration" not in raw and "at_s" not in raw:
        raise FaultSpecError(path, f"a {kind} fault needs at_iteration or at_s")
    it = raw.get("at_iteration")
    if it is not None and not 0 <= it < shape.iterations:
        raise FaultSpecError(f"{path}.at_iteration", f"iteration {it} does not exist: the run "
                             f"has iterations 0..{shape.iterations - 1} (warm-up included)")
    if raw.get("at_s") is not None and raw["at_s"] < 0:
        raise FaultSpecError(f"{path}.at_s", f"must be >= 0, got {raw['at_s']}")
    rank = raw.get("rank")
    if rank is not None and not 0 <= rank < shape.world_size:
        raise FaultSpecError(f"{path}.rank", f"rank {rank} does not exist: the cluster has "
                             f"ranks 0..{shape.world_size - 1}")
    rail, port = raw.get("rail"), raw.get("port")
    if kind == "port_failed":
        assert rail is not None and port is not None
        rails = shape.gpus_per_server
        if not 0 <= rail < rails:
            raise FaultSpecError(f"{path}.rail", f"rail {rail} does not exist: the cluster has "
                                 f"rails 0..{rails - 1}")
        if shape.port_owner(rail, port) is None:
            raise FaultSpecError(f"{path}.port", f"rail {rail} has no port {port} (its ranks' "
                                 "and spares' OpenFlow ports)")
    if kind == "jitter" and not raw["jitter_ms"] > 0:
        raise FaultSpecError(f"{path}.jitter_ms", f"must be > 0, got {raw['jitter_ms']}")
    if kind == "refuse" and raw.get("count", 1) < 1:
        raise FaultSpecError(f"{path}.count", f"must be >= 1, got {raw['count']}")
    return Fault(kind, index, rank=rank, rail=rail, port=port, at_iteration=it,
                 at_s=raw.get("at_s"), jitter_ms=float(raw.get("jitter_ms", 0.0)),
                 count=int(raw.get("count", 1)), position=position)


def failed_rank(fault: Fault, shape: ClusterShape) -> int | None:
    """The rank a fault takes down when it fires on the initial layout (None: no rank)."""
    if fault.kind in RANK_FAULTS:
        return fault.rank
    if fault.kind == "port_failed":
        assert fault.rail is not None and fault.port is not None
        owner = shape.port_owner(fault.rail, fault.port)
        return owner[1] if owner is not None and owner[0] == "rank" else None
    return None


def spare_shortage(faults: tuple[Fault, ...], shape: ClusterShape) -> tuple[Fault, str] | None:
    """The first fault that would find no spare on its rail (failures use spares in list order;
    a failed spare port loses that spare), with the reason; None if every failure has one."""
    free: dict[int, int] = {}
    for s in shape.spares:
        free[s.rail] = free.get(s.rail, 0) + 1
    for fault in faults:
        if fault.kind == "port_failed":
            assert fault.rail is not None and fault.port is not None
            owner = shape.port_owner(fault.rail, fault.port)
            if owner is not None and owner[0] == "spare":
                free[fault.rail] -= 1  # that spare is lost; it never took a rank
                continue
        rank = failed_rank(fault, shape)
        if rank is None:
            continue
        rail = shape.rail_of(rank)
        if free.get(rail, 0) < 1:
            have = sum(1 for s in shape.spares if s.rail == rail)
            return fault, (f"this is failure number {_failures_on(faults, fault, shape)} on "
                           f"rail {rail} (rank {rank}), which has {have} spare(s); add spares "
                           "(cluster.spares_per_server or cluster.spare_servers), set "
                           "failover.repair_s, or run with --no-spares")
        free[rail] -= 1
    return None


def _failures_on(faults: tuple[Fault, ...], upto: Fault, shape: ClusterShape) -> int:
    rail = shape.rail_of(failed_rank(upto, shape) or 0)
    n = 0
    for f in faults[: upto.index + 1]:
        r = failed_rank(f, shape)
        if r is not None and shape.rail_of(r) == rail:
            n += 1
    return n
