"""The records of the Opus core's calls: :class:`Instance` (one collective call), :class:`Group`
(a comm group with its calls) and :class:`JobEntry` (a registered job), and :class:`CallState`.

The call book (:mod:`controller.calls`) makes and keeps them; a switching model
(:mod:`controller.switching` states what it may change) reads them and writes the fields that
are the model's: a call's ``state`` from GATHER on, and the fields marked as the model's below.
A leaf below the call book and the models, so both import it without a cycle.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from controller.job import Edge, JobSpec
from controller.ocs import Circuit

__all__ = ["CallState", "Group", "Instance", "JobEntry"]


class CallState(enum.Enum):
    """Where a call is in its life cycle (:mod:`controller.calls` draws it;
    :mod:`controller.switching` says which transitions are the model's)."""

    GATHER = "gather"
    QUEUED = "queued"
    SWITCHING = "switching"
    ACTIVE = "active"


@dataclass(eq=False, slots=True, init=False)
class Instance:
    """One call ``(job, group, seq)``: who asked (really or speculatively), was acked, is done.

    The fields of the port-exact planner's queue live here too (``order``, ``in_queue``, ...):
    one object per call, so its hot paths reach them without a second lookup."""

    group: Group
    seq: int
    kind: str = ""
    size_bytes: int = 0
    axis: str = ""
    real: dict[int, object] = field(default_factory=dict)  # rank -> reply ref
    spec: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)
    completed: set[int] = field(default_factory=set)
    state: CallState = CallState.GATHER
    order: int = 0
    circuits: frozenset[Circuit] = frozenset()
    decision_id: int = -1
    spec_tried: bool = False
    t_first_s: float = 0.0
    # FCFS bookkeeping while QUEUED (controller.fcfs): in the queue; waiting in the heap of
    # calls to look at again; the tick at which it last waited (plan None) with nothing changed
    in_queue: bool = False
    in_ready: bool = False
    settled_tick: int = -1

    def __init__(self, group: Group, seq: int, t_first_s: float) -> None:
        # the generated __init__ minus its factory calls and keyword handling (one per call)
        self.group = group
        self.seq = seq
        self.t_first_s = t_first_s
        self.kind = self.axis = ""
        self.size_bytes = 0
        self.real = {}
        self.spec = set()
        self.acked = set()
        self.completed = set()
        self.state = CallState.GATHER
        self.order = 0
        self.circuits = frozenset()
        self.decision_id = -1
        self.spec_tried = self.in_queue = self.in_ready = False
        self.settled_tick = -1

    @property
    def asked(self) -> int:
        return len(self.real) + len(self.spec)

    @property
    def ready(self) -> bool:
        return self.asked >= len(self.group.members)


@dataclass(eq=False, slots=True)
class Group:
    """A comm group of a job: its members, its demand per optical rail, its calls.

    The port-exact planner's per-group caches (``cache``, ``lit_*``, ``rail_keys``, ...) sit
    here for the reason :class:`Instance` gives."""

    job_id: str
    group_id: str
    axis: str
    members: frozenset[int]
    demand: dict[int, frozenset[Edge]]  # optical rails only
    instances: dict[int, Instance] = field(default_factory=dict)
    done_seq: dict[int, int] = field(default_factory=dict)  # rank -> its last completed seq
    cache: dict[tuple[int, Edge], Circuit] = field(default_factory=dict)
    lit_version: int = -1
    lit_circuits: frozenset[Circuit] | None = None
    lit_found: list[Circuit] = field(default_factory=list)  # lit_circuits in cache_keys order
    rail_members: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # Precomputed once (the hot paths run per intent): member count, per rail the demand's
    # lookup keys ((rail, a, b) for the pair index, (rail, (a, b)) for the circuit cache) and
    # the ranks the demand touches in the order planning visits them.
    n_members: int = 0
    rail_keys: tuple[tuple[int, tuple[tuple[tuple[int, int, int], tuple[int, Edge]], ...]],
                     ...] = ()
    rail_ranks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    cache_keys: tuple[tuple[int, Edge], ...] = ()  # every demand edge's key, rail_keys order
    # per rail, the (rail, port) keys of every port of rail_ranks, in that order (set by the
    # planner when the job is registered): planning looks them up on every switch
    port_keys: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    owns_last: bool = False  # every (rail, rank) of ours has us as its last group (_activate)
    touch_tick: int = -1  # a port of a circuit in our cache that no member owns changed then
    alive: bool = True  # False once its job is unregistered (a decision may still be in flight)

    def __post_init__(self) -> None:
        self.rail_members = {rail: tuple(sorted({r for e in edges for r in e}))
                             for rail, edges in self.demand.items()}
        self.n_members = len(self.members)
        self.rail_keys = tuple(
            (rail, tuple(((rail, a, b), (rail, (a, b))) for a, b in edges))
            for rail, edges in self.demand.items())
        self.rail_ranks = {rail: tuple({r for e in edges for r in e})
                           for rail, edges in self.demand.items()}
        self.cache_keys = tuple(ck for _rail, keys in self.rail_keys for _pk, ck in keys)


@dataclass(eq=False, slots=True)
class JobEntry:
    """A registered job: its spec, its groups, its ranks' ports, its lost ranks."""

    spec: JobSpec
    groups: dict[str, Group]
    ports: dict[int, tuple[int, ...]] = field(default_factory=dict)  # rank -> its rail ports
    # ranks declared lost (rank_lost) and not back yet (rank_rejoined): calls of groups with
    # them are rejected, since they could never gather. Forgotten with the job (unregister).
    lost: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.ports = {r: rp.ports for r, rp in self.spec.ranks.items()}
