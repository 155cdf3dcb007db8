r"""The Opus scheduler: a pure core that turns events into decisions.

Every public method takes the current time ``now`` (seconds) and returns an :class:`Output`:
acknowledgements and rejections to send to shims, reconfiguration decisions for the OCS driver
and event-log records. The core never sleeps and never does I/O; the service, the simulator and
the tests are shells around it.

Model. A collective call of a comm group is an *instance* ``(job, group, seq)``; ``seq`` counts
the group's calls at each rank, so all members name the same call with the same number. As in the
paper, an instance is served once all its members have asked; with provisioning, speculative asks
count too, so the switch can start before the real intents arrive. The ack goes to every member
once all have really asked and the circuits are lit; until then no member can move data, so early
members lose nothing by waiting, and a call holds (protects) circuits only while it can actually
run, which keeps valid programs free of controller-induced deadlock. Life cycle::

    GATHER --all members asked--> QUEUED --plan fits--> SWITCHING --light--> ACTIVE --all done-->
       \-- all asked really and circuits already lit ---------------------> ACTIVE

Rules (the paper's §4, made precise; where a rule goes beyond the paper it says so):

* a group's demand is a set of rank pairs per rail; each pair needs one circuit between a port of
  each rank, within the ranks' K-port budget (:mod:`controller.job`);
* minimal change: circuits that the group still needs stay lit; circuits of ACTIVE instances are
  *protected* and are never touched; the ports of a reconfiguration in flight are *dark* and are
  not touched either; a plan that would need such a port waits;
* first-come-first-served: queued requests are served in the order they became ready; a request
  that waits blocks later requests that share a rank with it; speculative requests come last;
* all rails of a group switch as one decision (one ``apply_many``);
* no decision when the demand is already lit;
* base mode (the paper): when a group needs new circuits, every idle circuit on its members' ports
  that it does not use and that last served another parallelism (axis) is removed, so one rail
  configuration serves one parallelism. Idle circuits of the same parallelism stay (evicted
  least-recently-used first if ports run out): a pipeline stage's send/recv to the previous
  and to the next stage are two comm groups of one parallelism, and tearing one down for the
  other made the paper's "reconfigure when the parallelism changes" switch on every
  micro-batch, several times the reconfigurations per iteration (``opus-testbed bench sim
  --gpus 1024 --mode on-demand`` counts them; its module docstring has the figures);
* degree-aware mode (beyond the paper): idle circuits stay lit while spare ports exist and are
  evicted least-recently-used first only when ports run out; a call served without switching on
  a rail where its ranks were last used by another group (where the paper's Opus switches, since
  it reconfigures whenever the parallelism changes) counts as an avoided reconfiguration;
* provisioning: a completion may carry the rank's predicted next call (from the shim's profile);
  it counts as a speculative ask, so the switch starts as soon as the last member finished its
  previous call. Speculative circuits are not protected, so a wrong prediction only costs an
  on-demand switch later; a rank's real intent for another group cancels its speculative ask.

Semantics. All of the above is ``port-exact`` (the default): circuits are port matchings under
the one-to-one rule, as on a real OCS. ``rail-state`` (``CoreConfig.semantics``) is the model of
Opus's public artifact instead: a bitmask per rail, one bit per pipeline stage, switched per bit
(:mod:`controller.railstate` states its rules). The same core serves both: instances, gathering,
acks and completions are shared; serving, switching and provisioning of a rail-state job take the
``_rs_*`` methods at the end of :class:`OpusCore`, and the port-exact code never runs for it.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from controller.job import Edge, JobError, JobSpec
from controller.ocs import ApplyResult, Circuit, CrossconnectState, RailDescription, Reconfiguration
from controller.railstate import (
    INFLIGHT,
    JOIN,
    PORT_EXACT,
    RAIL_STATE,
    SEMANTICS,
    SHADOW_PORTS,
    Bit,
    BitOp,
    RailStateModel,
    bit_op_of,
    flip_reconf,
    job_shape,
    shadow_rail_id,
)

Event = dict[str, object]


@dataclass(frozen=True)
class CoreConfig:
    """Scheduling modes: provisioning (paper §4.1) and degree-aware assignment (ours), and the
    controller semantics: ``port-exact`` (one-to-one port matchings) or ``rail-state`` (the
    public artifact's bitmask per rail, :mod:`controller.railstate`), and under rail-state
    what a request does with a bit already being switched to its value (``rail_state_inflight``:
    ``join`` that switch, the default, or ``reflip`` as the artifact's controller does)."""

    provisioning: bool = False
    degree_aware: bool = False
    semantics: str = PORT_EXACT
    rail_state_inflight: str = JOIN

    def __post_init__(self) -> None:
        if self.semantics not in SEMANTICS:
            raise ValueError(f"semantics must be one of {', '.join(SEMANTICS)}, got "
                             f"{self.semantics!r}")
        if self.degree_aware and self.semantics == RAIL_STATE:
            raise ValueError("degree-aware assignment keeps port matchings; rail-state has "
                             "none (use port-exact semantics)")
        if self.rail_state_inflight not in INFLIGHT:
            raise ValueError(f"rail_state_inflight must be one of {', '.join(INFLIGHT)}, got "
                             f"{self.rail_state_inflight!r}")

    @classmethod
    def for_mode(cls, mode: str, semantics: str = PORT_EXACT,
                 rail_state_inflight: str = JOIN) -> CoreConfig:
        """The configuration of an experiment mode (``on-demand``: neither option)."""
        return cls(provisioning=mode == "provisioning", degree_aware=mode == "degree-aware",
                   semantics=semantics, rail_state_inflight=rail_state_inflight)


@dataclass(frozen=True, slots=True, init=False)
class Intent:
    """One rank's request for the circuits of one collective call."""

    job_id: str
    rank: int
    group_id: str
    seq: int
    kind: str = ""
    size_bytes: int = 0
    axis: str = ""

    def __init__(self, job_id: str, rank: int, group_id: str, seq: int, kind: str = "",
                 size_bytes: int = 0, axis: str = "") -> None:
        # the generated __init__ of a frozen class, at half its cost (one per intent); slots,
        # not a __dict__: one object fewer for the garbage collector per intent
        s_job, s_rank, s_group, s_seq, s_kind, s_size, s_axis = _INTENT_SETTERS
        s_job(self, job_id)
        s_rank(self, rank)
        s_group(self, group_id)
        s_seq(self, seq)
        s_kind(self, kind)
        s_size(self, size_bytes)
        s_axis(self, axis)

    def to_json(self) -> dict[str, object]:
        return {"job": self.job_id, "rank": self.rank, "group": self.group_id, "seq": self.seq,
                "kind": self.kind, "size_bytes": self.size_bytes, "axis": self.axis}


@dataclass(frozen=True, slots=True, init=False)
class Ack:
    """The circuits of ``group_id``'s call ``seq`` are lit: ``rank`` may start."""

    ref: object
    job_id: str
    rank: int
    group_id: str
    seq: int
    reconfigured: bool

    def __init__(self, ref: object, job_id: str, rank: int, group_id: str, seq: int,
                 reconfigured: bool) -> None:
        # the generated __init__ of a frozen class, at half its cost (one per acked rank)
        s_ref, s_job, s_rank, s_group, s_seq, s_reconfigured = _ACK_SETTERS
        s_ref(self, ref)
        s_job(self, job_id)
        s_rank(self, rank)
        s_group(self, group_id)
        s_seq(self, seq)
        s_reconfigured(self, reconfigured)


def _slot_setters(cls: type, names: str) -> tuple[Any, ...]:
    """The ``__set__`` of each named slot of ``cls``: how a frozen class sets its own fields."""
    return tuple(cls.__dict__[name].__set__ for name in names.split())


_INTENT_SETTERS = _slot_setters(Intent, "job_id rank group_id seq kind size_bytes axis")
_ACK_SETTERS = _slot_setters(Ack, "ref job_id rank group_id seq reconfigured")


@dataclass(frozen=True, slots=True)
class Reject:
    """A request refused (bad input, lost peer, failed switch); nothing changed for others."""

    ref: object
    code: str
    message: str


@dataclass(frozen=True, init=False)
class Decision:
    """Reconfigure these rails as one ``apply_many`` call; report back with its id."""

    decision_id: int
    job_id: str
    group_id: str
    seq: int
    reconfs: tuple[Reconfiguration, ...]
    speculative: bool

    def __init__(self, decision_id: int, job_id: str, group_id: str, seq: int,
                 reconfs: tuple[Reconfiguration, ...], speculative: bool) -> None:
        # the generated __init__ of a frozen class, without its object.__setattr__ calls
        d = self.__dict__
        d["decision_id"] = decision_id
        d["job_id"] = job_id
        d["group_id"] = group_id
        d["seq"] = seq
        d["reconfs"] = reconfs
        d["speculative"] = speculative


_FRESH: Any = object()  # "a new empty list" (what default_factory=list gives) for Output

#: An event not built yet: ``(builder, *fields)``; ``builder(record, into)`` appends the event
#: dict(s) it stands for to ``into``. The hot paths record these instead of dicts, so an event
#: costs a tuple unless someone reads :attr:`Output.events`.
LazyEvent = tuple[Any, ...]


_T = TypeVar("_T")


class _ListOnUse(Generic[_T]):
    """A list attribute of :class:`Output` kept in the slot named ``slot``, where ``None``
    stands for an empty list not made yet: the list is made when first read."""

    __slots__ = ("slot",)

    def __init__(self, slot: str) -> None:
        self.slot = slot

    @overload
    def __get__(self, obj: None, owner: object = None) -> _ListOnUse[_T]: ...

    @overload
    def __get__(self, obj: Output, owner: object = None) -> list[_T]: ...

    def __get__(self, obj: Output | None, owner: object = None) -> list[_T] | _ListOnUse[_T]:
        if obj is None:
            return self
        got: list[_T] | None = getattr(obj, self.slot)
        if got is None:
            got = []
            setattr(obj, self.slot, got)
        return got

    def __set__(self, obj: Output, value: list[_T]) -> None:
        setattr(obj, self.slot, value)


class Output:
    """Everything one event produced: acks, rejects, decisions and event-log records.

    ``events`` are built when first read (the core records the frequent ones as
    :data:`LazyEvent` tuples): every reader gets the same dicts, in the same order, as if they
    had been built on the spot; the core never records a value that changes afterwards.
    ``acks``, ``rejects`` and ``decisions`` are lists made when first read or written (most
    outputs have none of some): fewer objects per intent for the allocator and the garbage
    collector, the same lists for every reader.
    """

    __slots__ = ("_acks", "_built", "_decisions", "_events", "_rejects")

    def __init__(self, acks: list[Ack] = _FRESH, rejects: list[Reject] = _FRESH,
                 decisions: list[Decision] = _FRESH, events: list[Event] = _FRESH) -> None:
        self._acks: list[Ack] | None = None if acks is _FRESH else acks
        self._rejects: list[Reject] | None = None if rejects is _FRESH else rejects
        self._decisions: list[Decision] | None = None if decisions is _FRESH else decisions
        self._events: list[Event | LazyEvent] = [] if events is _FRESH else events  # type: ignore[assignment]
        self._built: list[Event] | None = None  # _events, once every record in it is built

    acks: _ListOnUse[Ack] = _ListOnUse("_acks")
    rejects: _ListOnUse[Reject] = _ListOnUse("_rejects")
    decisions: _ListOnUse[Decision] = _ListOnUse("_decisions")

    @property
    def events(self) -> list[Event]:
        """The event-log records (a list the caller may change), built on first read."""
        raw = self._events
        if raw is self._built:  # (read before: nothing was recorded since, only extend adds)
            return raw  # type: ignore[return-value]
        for e in raw:
            if e.__class__ is not dict:
                break
        else:
            self._built = raw  # type: ignore[assignment]
            return raw  # type: ignore[return-value]
        built: list[Event] = []
        for e in raw:
            if isinstance(e, dict):
                built.append(e)
            else:
                e[0](e, built)
        self._events = self._built = built  # type: ignore[assignment]
        return built

    @events.setter
    def events(self, events: list[Event]) -> None:
        self._events = events  # type: ignore[assignment]
        self._built = None

    def extend(self, other: Output) -> None:
        if other._acks:
            self.acks.extend(other._acks)
        if other._rejects:
            self.rejects.extend(other._rejects)
        if other._decisions:
            self.decisions.extend(other._decisions)
        # other's records built first: a list .events handed out stays a list of dicts
        self._events.extend(other.events)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Output)
        return (self.acks, self.rejects, self.decisions, self.events) == (
            other.acks, other.rejects, other.decisions, other.events)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        return (f"Output(acks={self.acks!r}, rejects={self.rejects!r}, "
                f"decisions={self.decisions!r}, events={self.events!r})")


# Builders of the lazily recorded events (see LazyEvent): each turns its record into the dict
# the core used to build on the spot, with the same keys in the same order.

def _ev_intent(r: LazyEvent, into: list[Event]) -> None:
    _, t_s, job, rank, group, seq, kind, size_bytes, axis = r
    into.append({"event": "intent", "t_s": t_s, "job": job, "rank": rank, "group": group,
                 "seq": seq, "kind": kind, "size_bytes": size_bytes, "axis": axis})


def _ev_complete(r: LazyEvent, into: list[Event]) -> None:
    _, t_s, job, rank, group, seq = r
    into.append({"event": "complete", "t_s": t_s, "job": job, "rank": rank, "group": group,
                 "seq": seq})


def _ev_acks(r: LazyEvent, into: list[Event]) -> None:
    """One ``ack`` event per rank of ``ranks``, in that order."""
    _, t_s, job, ranks, group, seq, reconfigured, wait_s = r
    for rank in ranks:
        into.append({"event": "ack", "t_s": t_s, "job": job, "rank": rank, "group": group,
                     "seq": seq, "reconfigured": reconfigured, "wait_s": wait_s})


def _ev_done(r: LazyEvent, into: list[Event]) -> None:
    _, t_s, job, group, seq = r
    into.append({"event": "collective_done", "t_s": t_s, "job": job, "group": group,
                 "seq": seq})


def _ev_provisioned(r: LazyEvent, into: list[Event]) -> None:
    _, t_s, job, group, seq = r
    into.append({"event": "provisioned", "t_s": t_s, "job": job, "group": group, "seq": seq})


def _ev_decision(r: LazyEvent, into: list[Event]) -> None:
    _, t_s, did, job, group, seq, spec, reconfs, waited_s = r
    into.append({"event": "decision", "t_s": t_s, "decision": did, "job": job, "group": group,
                 "seq": seq, "speculative": spec, "rails": [rc.rail for rc in reconfs],
                 "waited_s": waited_s})


def _ev_reconfig_start(r: LazyEvent, into: list[Event]) -> None:
    _, t_s, did, rc, touched = r
    into.append({"event": "reconfig_start", "t_s": t_s, "decision": did, "rail": rc.rail,
                 "ports": sorted(touched),
                 "add": [c.to_json() for c in sorted(rc.add)],
                 "remove": [c.to_json() for c in sorted(rc.remove)]})


def _ev_reconfig_end(r: LazyEvent, into: list[Event]) -> None:
    _, t_s, did, res = r
    into.append({"event": "reconfig_end", "t_s": t_s, "decision": did, "rail": res.rail,
                 "added": [c.to_json() for c in sorted(res.added)],
                 "removed": [c.to_json() for c in sorted(res.removed)],
                 "t_request_s": res.t_request_s, "t_dark_s": res.t_dark_s,
                 "t_light_s": res.t_light_s, "dark_ms": res.dark_ms})


class _State(enum.Enum):
    GATHER = "gather"
    QUEUED = "queued"
    SWITCHING = "switching"
    ACTIVE = "active"


_ACTIVE, _GATHER = _State.ACTIVE, _State.GATHER  # (module constants: read per intent)


@dataclass(eq=False, slots=True, init=False)
class _Instance:
    group: _Group
    seq: int
    kind: str = ""
    size_bytes: int = 0
    axis: str = ""
    real: dict[int, object] = field(default_factory=dict)  # rank -> reply ref
    spec: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)
    completed: set[int] = field(default_factory=set)
    state: _State = _State.GATHER
    order: int = 0
    circuits: frozenset[Circuit] = frozenset()
    decision_id: int = -1
    spec_tried: bool = False
    t_first_s: float = 0.0
    # FCFS bookkeeping while QUEUED (OpusCore._enqueue): in the queue; waiting in the heap of
    # calls to look at again; the tick at which it last waited (plan None) with nothing changed
    in_queue: bool = False
    in_ready: bool = False
    settled_tick: int = -1

    def __init__(self, group: _Group, seq: int, t_first_s: float) -> None:
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
        self.state = _State.GATHER
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
class _Group:
    job_id: str
    group_id: str
    axis: str
    members: frozenset[int]
    demand: dict[int, frozenset[Edge]]  # optical rails only
    instances: dict[int, _Instance] = field(default_factory=dict)
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
    # per rail, the (rail, port) keys of every port of rail_ranks, in that order (set by
    # register_job, which knows the ports): planning looks them up on every switch
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
class _Job:
    spec: JobSpec
    groups: dict[str, _Group]
    ports: dict[int, tuple[int, ...]] = field(default_factory=dict)  # rank -> its rail ports
    # ranks declared lost (rank_lost) and not back yet (rank_rejoined): calls of groups with
    # them are rejected, since they could never gather. Forgotten with the job (unregister).
    lost: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.ports = {r: rp.ports for r, rp in self.spec.ranks.items()}


@dataclass(eq=False, slots=True)
class _WaitLine:
    """The queued calls of one job that involve one rank: first-come-first-served is per rank.

    ``reals``: a heap of ``(order, call)`` of the calls with real asks; entries of calls that
    left the queue are dropped lazily. ``specs``: the calls only speculative asks made ready.
    """

    reals: list[tuple[int, _Instance]] = field(default_factory=list)
    specs: dict[_Instance, None] = field(default_factory=dict)

    def head(self) -> _Instance | None:
        """The oldest queued call with real asks: it blocks every later call on this rank."""
        reals = self.reals
        while reals:
            order, inst = reals[0]
            if inst.in_queue and inst.order == order:
                return inst
            heapq.heappop(reals)
        return None


@dataclass(eq=False, slots=True)
class _RailStateJob:
    """A rail-state job: its bit model, its groups' bit operations, its calls that switch."""

    job_id: str
    model: RailStateModel
    ops: dict[str, dict[int, BitOp]]  # group -> rail -> what serving its call does
    shadow: dict[Bit, int]  # (data rail, bit) -> the shadow rail that switches it
    calls: dict[int, _Instance] = field(default_factory=dict)  # request id -> its call
    inflight: dict[int, tuple[int, tuple[Reconfiguration, ...]]] = field(
        default_factory=dict)  # decision id -> (request id, its flips)
    next_request: int = 1


class OpusCore:
    """The pure Opus scheduler for one set of rails (one OCS driver).

    FCFS in time that does not grow with the queue: a queued call is looked at again only when
    something it depends on changed — a port of one of its ranks (a circuit added, removed,
    darkened, lit, protected or released; ports name their owner rank), the port owners (a job
    registered or unregistered), or an older call that blocked it on a shared rank left the
    queue. Every other queued call would wait again if looked at (its plan fails as before, or
    an older call still blocks it), so the full scan of the paper's FCFS rule and this one make
    the same decisions in the same order (the golden traces pin it).
    """

    def __init__(
        self,
        rails: Sequence[RailDescription],
        config: CoreConfig | None = None,
        circuits: Iterable[Circuit] = (),
    ) -> None:
        self.config = config or CoreConfig()
        self.rails = {r.rail: r for r in rails}
        self.optical = {r.rail for r in rails if r.mode == "ocs"}
        self.state = CrossconnectState({r.rail: r.ports for r in rails})
        self._pairs: dict[tuple[int, int, int], set[Circuit]] = {}  # (rail, rank a, rank b)
        # (rail, port) -> the circuit on it, mirroring self.state (which only _commit changes):
        # planning then finds the existing Circuit object instead of building an equal one
        self._circ_at: dict[tuple[int, int], Circuit] = {}
        self._owner: dict[tuple[int, int], tuple[str, int]] = {}  # (rail, port) -> (job, rank)
        self._jobs: dict[str, _Job] = {}
        self._protect: dict[Circuit, int] = {}
        self._dark: dict[tuple[int, int], int] = {}  # (rail, port) -> decision id
        self._dark_keys: dict[int, list[tuple[int, int]]] = {}
        self._inflight: dict[int, tuple[Decision, _Instance]] = {}
        self._queue: dict[_Instance, None] = {}  # the QUEUED calls
        self._lines: dict[int, dict[str, _WaitLine]] = {}  # rank -> job -> its queued calls
        # queued calls to look at again, as a heap in FCFS order ((not real, order), ...);
        # a call touched during a scan before the scan's position waits for the next pump
        self._ready: list[tuple[bool, int, int, _Instance]] = []
        self._later: list[tuple[bool, int, int, _Instance]] = []
        self._scan_key: tuple[bool, int] | None = None
        self._entry_ids = itertools.count()
        # change ticks: per rank (of any job: rank pairs index circuits), and of all ports
        self._tick = 0
        self._rank_tick: dict[int, int] = {}
        self._all_tick = 0
        # (rail, port) -> groups whose circuit cache holds a circuit on that port although no
        # member owns it (rank pairs match ranks of any job): planning may reuse it
        self._cached_at: dict[tuple[int, int], set[_Group]] = {}
        # (job, rank) -> the calls it asked for speculatively, in the order it asked
        self._spec_of: dict[tuple[str, int], dict[_Instance, None]] = {}
        self._last_used_s: dict[Circuit, float] = {}
        self._served_axis: dict[Circuit, str] = {}  # the parallelism a circuit last carried
        # Deferred bookkeeping (_settle): calls activated whose circuits _protect does not count
        # yet, and per circuit set released (a running call's end) its axis and time, oldest
        # first, not yet written to _served_axis / _last_used_s. Planning and commits read
        # these tables and settle them first; a call that ends before anyone looked costs no
        # per-circuit work at all (most calls: their circuits are lit, nobody plans meanwhile).
        self._protect_due: dict[_Instance, frozenset[Circuit]] = {}
        self._release_due: dict[frozenset[Circuit], tuple[str, float]] = {}
        # circuits a failed decision could not restore (their port was claimed by a later
        # decision): still on the switch; taken back once a later undo frees their ports
        self._diverged: set[Circuit] = set()
        # (rail, job, rank) -> the group that used the rank's circuits on that rail last
        self._last_group: dict[tuple[int, str, int], _Group] = {}
        self._version = 0
        self._order = 0
        self._next_decision = 1
        self.counters: dict[str, int] = {
            "intents": 0, "acks": 0, "decisions": 0, "reconfigurations": 0,
            "avoided_reconfigurations": 0, "speculative_decisions": 0, "mispredictions": 0,
            "rejects": 0,
        }
        self._rs: _RailStateJob | None = None  # the rail-state job (one per core)
        if self.config.semantics == RAIL_STATE:
            self.counters.update({"acked_at_once": 0, "bit_flips": 0, "stale_reflips": 0,
                                  "rail_state_joined_bits": 0, "rail_state_early_bits": 0,
                                  "late_predictions": 0})
        initial: dict[int, set[Circuit]] = {}
        for c in circuits:
            initial.setdefault(c.rail, set()).add(c)
        for rail, cs in initial.items():
            self._commit(Reconfiguration(rail, add=frozenset(cs)))

    # ------------------------------------------------------------------ jobs

    def register_job(self, job: JobSpec, now: float, ref: object = None) -> Output:
        """Add a job; a clash with the rails or another job's ports is rejected, nothing changes."""
        out = Output()
        try:
            self._check_job(job)
            rs = self._rs_new_job(job) if self.config.semantics == RAIL_STATE else None
        except JobError as exc:
            return self._reject(out, now, ref, "bad_job", str(exc), job=job.job_id)
        groups = {}
        for gid, grp in job.groups.items():
            demand = {rail: edges for rail, edges in job.demand[gid].items()
                      if rail in self.optical}
            groups[gid] = _Group(job.job_id, gid, grp.axis, frozenset(grp.ranks), demand)
        self._jobs[job.job_id] = jb = _Job(job, groups)
        for g in groups.values():
            g.port_keys = {rail: tuple((rail, p) for r in ranks for p in jb.ports[r])
                           for rail, ranks in g.rail_ranks.items()}
        for rank_ports in job.ranks.values():
            for p in rank_ports.ports:
                self._owner[(rank_ports.rail, p)] = (job.job_id, rank_ports.rank)
        self._rekey_pairs()
        out._events.append({"event": "job_registered", "t_s": now, "job": job.job_id,
                           "ranks": len(job.ranks), "groups": len(job.groups)})
        if rs is not None:
            self._rs = rs
        return out

    def _check_job(self, job: JobSpec) -> None:
        if job.job_id in self._jobs:
            raise JobError(f"job {job.job_id} is already registered")
        for rp in job.ranks.values():
            if rp.rail not in self.rails:
                raise JobError(f"job {job.job_id}: rank {rp.rank} is on rail {rp.rail}, "
                               f"which the OCS does not have (rails: {sorted(self.rails)})")
            known = self.state.ports(rp.rail)
            bad = [p for p in rp.ports if p not in known]
            if bad:
                raise JobError(f"job {job.job_id}: rank {rp.rank} names ports {bad} that rail "
                               f"{rp.rail} does not have")
            for p in rp.ports:
                other = self._owner.get((rp.rail, p))
                if other is not None:
                    raise JobError(f"job {job.job_id}: rank {rp.rank} claims rail {rp.rail} port "
                                   f"{p}, owned by job {other[0]} rank {other[1]}")

    def unregister_job(self, job_id: str, now: float) -> Output:
        """Drop a job: its waiting ranks get an error; its circuits stay as they are.

        A decision of the job still in flight ends as an ``orphaned_decision``: the
        crossconnect state follows the driver's outcome, the dead job's calls are not served.
        """
        out = Output()
        job = self._jobs.pop(job_id, None)
        if job is None:
            return self._reject(out, now, None, "unknown_job", f"no job {job_id!r}")
        if self._rs is not None and self._rs.job_id == job_id:
            self._rs = None  # its switches in flight end as unknown decisions
        for grp in job.groups.values():
            grp.alive = False
            for inst in grp.instances.values():
                for rank, ref in inst.real.items():
                    if rank not in inst.acked:
                        self._reject(out, now, ref, "job_unregistered",
                                     f"job {job_id} was unregistered")
                if inst.state is _State.ACTIVE:
                    self._unprotect(inst, now)
        for inst in [i for i in self._queue if i.group.job_id == job_id]:
            del self._queue[inst]  # (its state stays QUEUED: its group is dead)
            inst.in_queue = inst.in_ready = False
        for by_job in self._lines.values():
            by_job.pop(job_id, None)
        for groups in self._cached_at.values():
            groups.difference_update(job.groups.values())
        for key in [k for k, v in self._owner.items() if v[0] == job_id]:
            del self._owner[key]
        self._rekey_pairs()
        for spec_key in [k for k in self._spec_of if k[0] == job_id]:
            del self._spec_of[spec_key]
        out._events.append({"event": "job_unregistered", "t_s": now, "job": job_id})
        self._pump(now, out)
        return out

    def job(self, job_id: str) -> JobSpec | None:
        j = self._jobs.get(job_id)
        return j.spec if j else None

    # --------------------------------------------------------------- intents

    def intent(self, intent: Intent, now: float, ref: object = None) -> Output:
        """A rank asks for the circuits of one call; ack now, later, or reject."""
        out = Output()
        self.counters["intents"] += 1
        job_id, rank, group_id, seq = intent.job_id, intent.rank, intent.group_id, intent.seq
        job = self._jobs.get(job_id)
        grp = job.groups.get(group_id) if job is not None else None
        # (a member is a rank of the job: JobSpec checks it)
        if (job is None or grp is None or rank not in grp.members
                or seq <= grp.done_seq.get(rank, -1)):
            self._lookup(intent, out, now, ref)  # rejects, naming the first failed check
            return out
        if job.lost and not job.lost.isdisjoint(grp.members):
            lost = min(job.lost & grp.members)
            return self._reject(out, now, ref, "peer_lost",
                                f"rank {lost} of group {group_id} disconnected",
                                job=job_id, rank=rank, group=group_id, seq=seq)
        kind, size_bytes, axis = intent.kind, intent.size_bytes, intent.axis
        out._events.append((_ev_intent, now, job_id, rank, group_id, seq, kind, size_bytes,
                            axis))
        inst = grp.instances.get(seq)
        if inst is not None and rank in inst.real:
            return self._reject(out, now, ref, "duplicate",
                                f"rank {rank} already asked for group {grp.group_id} call {seq}")
        if self._rs is not None:
            self._rs_intent(self._rs, grp, inst, intent, now, ref, out)
            return out
        if self._spec_of:
            self._cancel_speculation(job.spec.job_id, rank, grp, seq, now, out)
        if inst is None:
            inst = grp.instances[seq] = _Instance(grp, seq, now)  # (as _new_instance)
        inst.kind, inst.size_bytes, inst.axis = kind, size_bytes, axis
        spec = inst.spec
        if spec:
            spec.discard(rank)
        real = inst.real
        turns_real = not real and inst.in_queue
        real[rank] = ref
        if turns_real:
            self._queued_turns_real(inst)
        state = inst.state
        if state is _ACTIVE:
            self._ack(inst, out, now)
        elif state is _GATHER and len(real) + len(spec) >= grp.n_members:
            self._advance(inst, now, out)  # (it does nothing until everyone asked)
        return out

    def complete(self, job_id: str, rank: int, group_id: str, seq: int, now: float,
                 ref: object = None, next_intent: Intent | None = None) -> Output:
        """A rank finished its part of a call; ``next_intent`` is its predicted next call."""
        out = Output()
        job = self._jobs.get(job_id)
        grp = job.groups.get(group_id) if job is not None else None
        inst = grp.instances.get(seq) if grp is not None else None
        if job is None or grp is None or inst is None or rank not in inst.acked:
            return self._reject(out, now, ref, "bad_completion",
                                f"job {job_id} rank {rank}: no acknowledged call {seq} of group "
                                f"{group_id} to complete")
        completed = inst.completed
        if rank in completed:
            return self._reject(out, now, ref, "duplicate",
                                f"rank {rank} already completed group {group_id} call {seq}")
        completed.add(rank)
        done_seq = grp.done_seq
        if seq > done_seq.get(rank, -1):
            done_seq[rank] = seq
        out._events.append((_ev_complete, now, job_id, rank, group_id, seq))
        if len(completed) >= grp.n_members:
            self._finish(inst, now, out)
        if next_intent is not None and self.config.provisioning and self._rs is None:
            self._speculate(next_intent, now, out, ref)
        if self._queue:
            self._pump(now, out)
        return out

    def rank_lost(self, job_id: str, rank: int, now: float) -> Output:
        """A rank's shim is gone: release its running calls and fail the calls waiting on it.

        The job remembers the rank: later calls of its groups are rejected (``peer_lost``) and
        a call of one being switched is failed when the switch ends, until the rank greets
        again (:meth:`rank_rejoined`) or the job is unregistered (which forgets everything).
        """
        out = Output()
        job = self._jobs.get(job_id)
        if job is None or rank not in job.spec.ranks:
            return out
        out._events.append({"event": "rank_lost", "t_s": now, "job": job_id, "rank": rank})
        job.lost.add(rank)  # later calls of its groups are rejected too (intent)
        for grp in job.groups.values():
            if rank not in grp.members:
                continue
            for inst in list(grp.instances.values()):
                if inst.state is _State.ACTIVE:
                    inst.completed.add(rank)
                    if len(inst.completed) >= len(grp.members):
                        self._finish(inst, now, out)
                elif inst.state in (_State.GATHER, _State.QUEUED):
                    for r, ref in inst.real.items():
                        if r != rank:
                            self._reject(out, now, ref, "peer_lost",
                                         f"rank {rank} of group {grp.group_id} disconnected")
                    self._drop(inst)
                else:  # SWITCHING: finishes, then reconfig_done fails the survivors
                    inst.real.pop(rank, None)
                    inst.spec.discard(rank)
        self._spec_of.pop((job_id, rank), None)
        self._pump(now, out)
        return out

    def rank_rejoined(self, job_id: str, rank: int, now: float) -> Output:
        """A rank lost before greets the controller again: its groups are served again.

        The service calls this whenever it opens a session for the rank (a shim's hello,
        heartbeat or request after it was declared lost); for a rank that is not marked lost
        it does nothing.
        """
        out = Output()
        job = self._jobs.get(job_id)
        if job is None or rank not in job.lost:
            return out
        job.lost.discard(rank)
        out._events.append({"event": "rank_rejoined", "t_s": now, "job": job_id, "rank": rank})
        return out

    # ------------------------------------------------------- driver feedback

    def reconfig_done(self, decision_id: int, results: Sequence[ApplyResult],
                      now: float) -> Output:
        """The driver lit the circuits of a decision: ack its waiting ranks, serve the queue."""
        if self._rs is not None and decision_id in self._rs.inflight:
            return self._rs_done(self._rs, decision_id, results, now)
        out = Output()
        entry = self._inflight.pop(decision_id, None)
        if entry is None:
            return out
        _decision, inst = entry
        self._undark(decision_id)
        self._end_events(decision_id, results, now, out)
        if not inst.group.alive:
            self._orphaned(decision_id, inst, "done", now, out)
        elif inst.group.instances.get(inst.seq) is inst:
            inst.state = _State.GATHER
            if self._lost_while_switching(inst, now, out):
                pass  # the survivors were told
            elif len(inst.real) >= len(inst.group.members):
                lit = self._lit(inst.group)
                if lit is not None:
                    self._activate(inst, lit, now, out, reconfigured=True)
                else:
                    self._advance(inst, now, out)
            else:
                inst.spec_tried = True
                out._events.append((_ev_provisioned, now, inst.group.job_id,
                                    inst.group.group_id, inst.seq))
                if not inst.spec and not inst.real:
                    self._drop(inst)
        self._pump(now, out)
        return out

    def _lost_while_switching(self, inst: _Instance, now: float, out: Output) -> bool:
        """A member of the call was lost while its circuits switched: fail the others' asks
        and drop the call (True), or nothing (False)."""
        grp = inst.group
        lost = self._jobs[grp.job_id].lost
        if not lost or lost.isdisjoint(grp.members):
            return False
        for _rank, ref in inst.real.items():
            self._reject(out, now, ref, "peer_lost",
                         f"rank {min(lost & grp.members)} of group {grp.group_id} disconnected")
        self._drop(inst)
        return True

    def reconfig_failed(self, decision_id: int, error: str, now: float) -> Output:
        """The driver refused or failed one decision; see :meth:`reconfigs_failed`."""
        return self.reconfigs_failed((decision_id,), error, now)

    def reconfigs_failed(self, decision_ids: Iterable[int], error: str, now: float,
                         withdrawn: Iterable[int] = ()) -> Output:
        """The driver refused or failed these decisions (a request carries several): undo
        their plans, tell the waiting ranks, then serve the queue once.

        ``withdrawn`` are further decisions that never reached the switch because they were
        planned on the failed ones' circuits (:meth:`controller.batching.RailBatcher.failed`):
        they fail too, their events marked ``withdrawn``. Plans are committed at dispatch, in
        decision order, so they are undone newest first: each undo then finds the state its
        decision left, and the core ends with what the switch holds. Serving the queue only
        after every undo keeps a new plan from resting on a circuit about to be undone.

        A later decision may still hold a port that a failed plan freed (one that does not
        fail with it); then that undo cannot apply whole, and it is applied circuit by circuit
        instead: every circuit the plan added that is still there is dropped, and every
        circuit it removed comes back if both its ports are free. Each circuit left over (not
        restored: its port is held; not dropped: already gone) is named in a
        ``state_diverged`` event with the rail and the error, so the divergence from the
        driver is in the log, not silent; the ports stay with whichever decision holds them
        now. The waiting ranks are rejected as for any failed decision.
        """
        out = Output()
        withdrawn = set(withdrawn)
        for did in sorted({*decision_ids, *withdrawn}, reverse=True):
            text = (f"withdrawn: planned on the circuits of a switch that failed ({error})"
                    if did in withdrawn else error)
            if self._rs is not None and did in self._rs.inflight:
                out.extend(self._rs_failed(self._rs, did, text, now, did in withdrawn))
            else:
                self._fail_decision(did, text, now, out, did in withdrawn)
        self._pump(now, out)
        return out

    def _fail_decision(self, decision_id: int, error: str, now: float, out: Output,
                       withdrawn: bool) -> None:
        """Undo one failed decision and reject its waiting ranks (the caller pumps)."""
        entry = self._inflight.pop(decision_id, None)
        if entry is None:
            return
        decision, inst = entry
        self._undark(decision_id)
        event: dict[str, object] = {"event": "reconfig_failed", "t_s": now,
                                    "decision": decision_id, "error": error}
        if withdrawn:
            event["withdrawn"] = True
        out._events.append(event)
        for rc in decision.reconfs:
            self._undo(decision_id, rc, now, out)
        if self._diverged:
            self._restore_diverged(decision_id, now, out)
        if not inst.group.alive:  # its ranks were told at unregister_job
            self._orphaned(decision_id, inst, "failed", now, out)
            return
        for _rank, ref in inst.real.items():
            self._reject(out, now, ref, "reconfig_failed",
                         f"switching for group {inst.group.group_id} failed: {error}")
        self._drop(inst)

    def _undo(self, decision_id: int, rc: Reconfiguration, now: float, out: Output) -> None:
        """Revert ``rc`` (committed at dispatch); what cannot be reverted is reported."""
        try:
            self._commit(Reconfiguration(rc.rail, add=rc.remove, remove=rc.add))
            return
        except ValueError as exc:
            error = str(exc)
        present = self.state.circuits(rc.rail)
        self._commit(Reconfiguration(rc.rail, remove=rc.add & present))
        peer = self.state.peer
        restore = frozenset(c for c in rc.remove
                            if peer(rc.rail, c.port_a) is None and peer(rc.rail, c.port_b) is None)
        self._commit(Reconfiguration(rc.rail, add=restore))
        self._diverged.update(rc.remove - restore)
        out._events.append({
            "event": "state_diverged", "t_s": now, "decision": decision_id, "rail": rc.rail,
            "not_restored": [c.to_json() for c in sorted(rc.remove - restore)],
            "not_dropped": [c.to_json() for c in sorted(rc.add - present)],
            "error": error})

    def _restore_diverged(self, decision_id: int, now: float, out: Output) -> None:
        """Take back the diverged circuits whose ports are free again (the decision that had
        claimed them failed too): the state matches the switch once more."""
        peer = self.state.peer
        back = {c for c in self._diverged if peer(c.rail, c.port_a) is None
                and peer(c.rail, c.port_b) is None and (c.rail, c.port_a) not in self._dark
                and (c.rail, c.port_b) not in self._dark}
        for rail in sorted({c.rail for c in back}):
            mine = frozenset(c for c in back if c.rail == rail)
            self._commit(Reconfiguration(rail, add=mine))
            out._events.append({"event": "state_restored", "t_s": now, "decision": decision_id,
                               "rail": rail, "restored": [c.to_json() for c in
                                                          sorted(mine)]})
        self._diverged -= back

    @staticmethod
    def _end_events(decision_id: int, results: Sequence[ApplyResult], now: float,
                    out: Output) -> None:
        events = out._events
        for res in results:
            events.append((_ev_reconfig_end, now, decision_id, res))

    @staticmethod
    def _orphaned(decision_id: int, inst: _Instance, outcome: str, now: float,
                  out: Output) -> None:
        """A decision of an unregistered job ended: the crossconnect state already follows the
        driver (committed at dispatch, undone on failure) and its dark ports are released; the
        dead job's call is not served, told or otherwise touched."""
        grp = inst.group
        out._events.append({"event": "orphaned_decision", "t_s": now, "decision": decision_id,
                           "job": grp.job_id, "group": grp.group_id, "seq": inst.seq,
                           "outcome": outcome})

    # ------------------------------------------------------------ internals

    def _lookup(self, intent: Intent, out: Output, now: float,
                ref: object) -> tuple[_Job, _Group] | None:
        job = self._jobs.get(intent.job_id)
        if job is None:
            self._reject(out, now, ref, "unknown_job", f"no job {intent.job_id!r} is registered")
            return None
        if intent.rank not in job.spec.ranks:
            self._reject(out, now, ref, "unknown_rank",
                         f"job {intent.job_id} has no rank {intent.rank}")
            return None
        grp = job.groups.get(intent.group_id)
        if grp is None:
            self._reject(out, now, ref, "unknown_group",
                         f"job {intent.job_id} has no comm group {intent.group_id!r}")
            return None
        if intent.rank not in grp.members:
            self._reject(out, now, ref, "not_a_member",
                         f"rank {intent.rank} is not in group {intent.group_id}")
            return None
        if intent.seq <= grp.done_seq.get(intent.rank, -1):
            self._reject(out, now, ref, "stale_seq",
                         f"rank {intent.rank} already completed call {intent.seq} of group "
                         f"{intent.group_id}")
            return None
        return job, grp

    def _new_instance(self, grp: _Group, seq: int, now: float) -> _Instance:
        inst = _Instance(grp, seq, now)
        grp.instances[seq] = inst
        return inst

    def _reject(self, out: Output, now: float, ref: object, code: str, message: str,
                **fields: object) -> Output:
        self.counters["rejects"] += 1
        out.rejects.append(Reject(ref, code, message))
        out._events.append({"event": "error", "t_s": now, "code": code, "message": message,
                           **fields})
        return out

    def _advance(self, inst: _Instance, now: float, out: Output) -> None:
        """A GATHER instance got a new ask: ack when all asked and lit, else queue when ready."""
        n_members = inst.group.n_members
        n_real = len(inst.real)
        # lit on arrival: ack at once, unless an older queued call on its ranks goes first
        if n_real >= n_members and not (self._queue and self._queued_conflict(inst)):
            lit = self._lit(inst.group)
            if lit is not None:
                self._activate(inst, lit, now, out, reconfigured=False)
                return
        if n_real + len(inst.spec) >= n_members and (n_real or not inst.spec_tried):
            self._order += 1
            inst.order = self._order
            if self._queue:
                self._enqueue(inst)
                self._pump(now, out)
            elif not self._serve(inst, now, out):  # alone: no wait lines unless it waits
                self._enqueue(inst)
                inst.settled_tick = self._tick

    def _queued_conflict(self, inst: _Instance) -> bool:
        """A queued call of the job with real asks shares a rank with ``inst``."""
        job_id = inst.group.job_id
        lines = self._lines
        for r in inst.group.members:
            by_job = lines.get(r)
            line = by_job.get(job_id) if by_job else None
            if line is not None and line.head() is not None:
                return True
        return False

    def _lit(self, grp: _Group) -> frozenset[Circuit] | None:
        """The circuits that realise the group's demand now, or None if some are missing/dark."""
        version = self._version
        if grp.lit_version == version:
            return grp.lit_circuits
        pairs = self._pairs
        dark = self._dark
        cache = grp.cache
        found: list[Circuit] = []
        result: frozenset[Circuit] | None = None
        ok = True
        for rail, keys in grp.rail_keys:
            for pair_key, cache_key in keys:
                cands = pairs.get(pair_key)
                if not cands:
                    ok = False
                    break
                cached = cache.get(cache_key)
                if cached is not None and cached in cands and (not dark or (
                        (rail, cached.port_a) not in dark
                        and (rail, cached.port_b) not in dark)):
                    found.append(cached)
                    continue
                c = self._pick(rail, cache_key, cands, cache, dark)
                if c is None:
                    ok = False
                    break
                found.append(c)
            if not ok:
                break
        if ok:
            result = frozenset(found)
            grp.lit_found = found
        grp.lit_version, grp.lit_circuits = version, result
        return result

    @staticmethod
    def _pick(rail: int, cache_key: tuple[int, Edge], cands: set[Circuit],
              cache: Mapping[tuple[int, Edge], Circuit], dark: Mapping[tuple[int, int], int]
              ) -> Circuit | None:
        """A circuit of ``cands`` that is not dark, the one the group used last if possible."""
        cached = cache.get(cache_key)
        if cached is not None and cached in cands and (rail, cached.port_a) not in dark and (
                rail, cached.port_b) not in dark:
            return cached
        for c in cands:
            if (rail, c.port_a) not in dark and (rail, c.port_b) not in dark:
                return c
        return None

    def _activate(self, inst: _Instance, circuits: frozenset[Circuit], now: float, out: Output,
                  reconfigured: bool) -> None:
        inst.state = _ACTIVE
        inst.circuits = circuits
        grp = inst.group
        avoided_rails: set[int] | tuple[()] = ()
        if not grp.owns_last:  # else every (rail, rank) of ours still names us: nothing changes
            avoided_rails = set()
            last = self._last_group
            job_id, gid = grp.job_id, grp.group_id
            for rail, ranks in grp.rail_members.items():
                for r in ranks:
                    key = (rail, job_id, r)
                    prev = last.get(key)
                    if prev is not grp:
                        if prev is not None:
                            prev.owns_last = False
                            if prev.group_id != gid:
                                avoided_rails.add(rail)
                        last[key] = grp
            grp.owns_last = True
            if not self.config.degree_aware or reconfigured:
                avoided_rails.clear()
        if circuits:
            self._protect_due[inst] = circuits  # counted in _protect by _settle
        if self._queue:
            self._touch_circuits(circuits)
        if reconfigured and circuits is grp.lit_circuits:  # (always: reconfig_done passes
            # what _lit just found) remember the circuit of every demand edge; _lit found them
            # in key order (a circuit's rank-pair key is the edge it serves: the pair index is
            # keyed so), and lit_found holds them only while they are lit_circuits
            owner = self._owner
            cache = grp.cache
            job_id = grp.job_id
            for cache_key, c in zip(grp.cache_keys, grp.lit_found, strict=True):
                cached = cache.get(cache_key)
                if cached is not c and cached != c:
                    cache[cache_key] = c
                    if (owner[(c.rail, c.port_a)][0] != job_id
                            or owner[(c.rail, c.port_b)][0] != job_id):
                        self._cache_foreign(grp, c)
        if avoided_rails:
            self.counters["avoided_reconfigurations"] += len(avoided_rails)
            out._events.append({"event": "reconfig_avoided", "t_s": now, "job": grp.job_id,
                               "group": grp.group_id, "seq": inst.seq,
                               "rails": sorted(avoided_rails)})
        self._ack(inst, out, now, reconfigured)
        if len(inst.completed) >= grp.n_members:
            self._finish(inst, now, out)

    def _ack(self, inst: _Instance, out: Output, now: float, reconfigured: bool = False) -> None:
        grp = inst.group
        job_id, group_id, seq = grp.job_id, grp.group_id, inst.seq
        acked = inst.acked
        real = inst.real
        if not acked:  # (the usual case: the call goes, every asker is acked at once)
            ranks = list(real)
            acked.update(ranks)
            new_acks = [Ack(ref, job_id, rank, group_id, seq, reconfigured)
                        for rank, ref in real.items()]
            if out._acks is None:
                out._acks = new_acks
            else:
                out._acks += new_acks
        else:
            acks = out.acks
            ranks = []
            for rank, ref in real.items():
                if rank in acked:
                    continue
                acked.add(rank)
                ranks.append(rank)
                acks.append(Ack(ref, job_id, rank, group_id, seq, reconfigured))
        if ranks:
            self.counters["acks"] += len(ranks)
            out._events.append((_ev_acks, now, job_id, ranks, group_id, seq, reconfigured,
                                now - inst.t_first_s))

    def _finish(self, inst: _Instance, now: float, out: Output) -> None:
        self._unprotect(inst, now)
        self._drop(inst)
        out._events.append((_ev_done, now, inst.group.job_id, inst.group.group_id, inst.seq))

    def _unprotect(self, inst: _Instance, now: float) -> None:
        circuits = inst.circuits
        if not circuits:
            return
        if self._protect_due.pop(inst, None) is None:  # else never counted: nothing to undo
            protect = self._protect
            for c in circuits:
                n = protect.get(c, 0) - 1
                if n <= 0:
                    protect.pop(c, None)
                else:
                    protect[c] = n
        due = self._release_due
        if circuits in due:
            del due[circuits]  # (re-inserted last: the latest release is written last)
        due[circuits] = (inst.group.axis, now)
        if self._queue:
            self._touch_circuits(circuits)
        inst.circuits = frozenset()

    def _settle(self) -> None:
        """Bring _protect, _served_axis and _last_used_s up to date (see __init__): the same
        contents as if every activation and release had been written when it happened."""
        if self._protect_due:
            protect = self._protect
            for circuits in self._protect_due.values():
                for c in circuits:
                    protect[c] = protect.get(c, 0) + 1
            self._protect_due.clear()
        if self._release_due:
            served = self._served_axis
            last_used = self._last_used_s
            for circuits, (axis, t_s) in self._release_due.items():
                for c in circuits:
                    served[c] = axis
                    last_used[c] = t_s
            self._release_due.clear()

    def _drop(self, inst: _Instance) -> None:
        grp = inst.group
        instances = grp.instances
        if instances.get(inst.seq) is inst:
            del instances[inst.seq]
        if inst.in_queue:
            self._dequeue(inst)
        for rank in inst.spec:
            s = self._spec_of.get((grp.job_id, rank))
            if s is not None:
                s.pop(inst, None)

    # ---------------------------------------------------------- speculation

    def _speculate(self, nxt: Intent, now: float, out: Output, ref: object) -> None:
        job = self._jobs.get(nxt.job_id)
        grp = job.groups.get(nxt.group_id) if job else None
        if job is None or grp is None or nxt.rank not in grp.members or (
            nxt.seq <= grp.done_seq.get(nxt.rank, -1)
        ):
            out._events.append({"event": "error", "t_s": now, "code": "bad_prediction",
                               "message": f"ignored prediction {nxt.to_json()}"})
            return
        if job.lost and not job.lost.isdisjoint(grp.members):
            out._events.append({"event": "error", "t_s": now, "code": "peer_lost",
                               "message": f"ignored prediction {nxt.to_json()}: rank "
                                          f"{min(job.lost & grp.members)} of group "
                                          f"{grp.group_id} disconnected"})
            return
        inst = grp.instances.get(nxt.seq)
        if inst is None:
            inst = self._new_instance(grp, nxt.seq, now)
            inst.kind, inst.size_bytes, inst.axis = nxt.kind, nxt.size_bytes, nxt.axis
        if nxt.rank in inst.real or inst.state is _State.ACTIVE:
            return
        inst.spec.add(nxt.rank)
        self._spec_of.setdefault((nxt.job_id, nxt.rank), {})[inst] = None
        out._events.append({"event": "speculative_intent", "t_s": now, "job": nxt.job_id,
                           "rank": nxt.rank, "group": nxt.group_id, "seq": nxt.seq,
                           "kind": nxt.kind, "size_bytes": nxt.size_bytes})
        if inst.state is _State.GATHER:
            if self._rs is not None:
                self._rs_gathered(self._rs, inst, now, out)
            else:
                self._advance(inst, now, out)

    def _cancel_speculation(self, job_id: str, rank: int, grp: _Group, seq: int, now: float,
                            out: Output) -> None:
        insts = self._spec_of.get((job_id, rank))
        if not insts:
            return
        for inst in list(insts):
            insts.pop(inst, None)
            if inst.group is grp and inst.seq == seq:
                continue
            inst.spec.discard(rank)
            self.counters["mispredictions"] += 1
            out._events.append({"event": "mispredict", "t_s": now, "job": job_id, "rank": rank,
                               "predicted_group": inst.group.group_id, "predicted_seq": inst.seq,
                               "actual_group": grp.group_id, "actual_seq": seq})
            if inst.state is _State.QUEUED and not inst.ready:
                self._dequeue(inst)
                inst.state = _State.GATHER
            if inst.state is _State.GATHER and not inst.real and not inst.spec:
                self._drop(inst)

    # ------------------------------------------------------------- planning

    def _pump(self, now: float, out: Output) -> None:
        """Serve the queue in FCFS order; a waiting real request blocks later ones it overlaps."""
        if self._ready:
            self._serve_queue(now, out)

    def _serve_queue(self, now: float, out: Output) -> None:
        """Look at the queued calls that may go now, oldest first (real asks before speculative).

        A call that shares a rank with an older waiting call with real asks is blocked; one
        that waited with nothing changed since would wait again: both are passed over.
        """
        ready = self._ready
        heappop = heapq.heappop
        while ready:
            spec_only, order, _, inst = heappop(ready)
            if not inst.in_queue or inst.order != order or (not inst.real) is not spec_only:
                continue  # left the queue, or was pushed again under its new key
            inst.in_ready = False
            if self._blocked(inst) or self._settled(inst):
                continue
            self._scan_key = (spec_only, order)
            self._serve(inst, now, out)
        self._scan_key = None
        if self._later:  # touched behind the scan's position: looked at by the next pump
            for entry in self._later:
                heapq.heappush(ready, entry)
            self._later.clear()

    def _serve(self, inst: _Instance, now: float, out: Output) -> bool:
        """Serve a ready call if it can go now (a queued one leaves the queue): ack it when its
        circuits are lit, switch them when a plan fits; False when it has to wait."""
        grp = inst.group
        lit = self._lit(grp)
        if lit is not None:
            if inst.in_queue:
                self._dequeue(inst)
            inst.state = _State.GATHER
            if len(inst.real) >= grp.n_members:
                self._activate(inst, lit, now, out, reconfigured=False)
            else:
                inst.spec_tried = True  # provisioned already; ack once everyone asked
            return True
        plan = self._plan(grp, now)
        if plan is None:
            inst.settled_tick = self._tick  # waits until something it needs changes
            return False
        if inst.in_queue:
            self._dequeue(inst)
        self._dispatch(inst, plan, now, out)
        return True

    # ---------------------------------------------------------- FCFS queue

    def _enqueue(self, inst: _Instance) -> None:
        """Queue a ready call (its ``order`` set): it waits in the line of each of its ranks."""
        inst.state = _State.QUEUED
        inst.in_queue = True
        inst.in_ready = False
        inst.settled_tick = -1
        self._queue[inst] = None
        grp = inst.group
        job_id = grp.job_id
        lines = self._lines
        entry = (inst.order, inst)
        real = bool(inst.real)
        for r in grp.members:
            by_job = lines.get(r)
            if by_job is None:
                by_job = lines[r] = {}
            line = by_job.get(job_id)
            if line is None:
                line = by_job[job_id] = _WaitLine()
            if real:
                heapq.heappush(line.reals, entry)
            else:
                line.specs[inst] = None
        self._reconsider(inst)

    def _dequeue(self, inst: _Instance) -> None:
        """Take a call out of the queue; the calls it blocked on its ranks may go now."""
        del self._queue[inst]
        inst.in_queue = inst.in_ready = False
        grp = inst.group
        job_id = grp.job_id
        lines = self._lines
        if inst.real:
            for r in grp.members:
                line = lines[r][job_id]
                head = line.head()
                if head is not None:
                    self._reconsider(head)
                else:
                    for s in line.specs:
                        self._reconsider(s)
        else:
            for r in grp.members:
                del lines[r][job_id].specs[inst]

    def _queued_turns_real(self, inst: _Instance) -> None:
        """A queued call that only speculative asks made ready got its first real ask."""
        job_id = inst.group.job_id
        lines = self._lines
        entry = (inst.order, inst)
        for r in inst.group.members:
            line = lines[r][job_id]
            del line.specs[inst]
            heapq.heappush(line.reals, entry)
        inst.in_ready = False  # its entry under the speculative key is stale now
        self._reconsider(inst)

    def _reconsider(self, inst: _Instance) -> None:
        """Look at a queued call again at the next scan (this one, if it is still ahead)."""
        if inst.in_ready:
            return
        inst.in_ready = True
        spec_only = not inst.real
        entry = (spec_only, inst.order, next(self._entry_ids), inst)
        scan = self._scan_key
        if scan is not None and (spec_only, inst.order) <= scan:
            self._later.append(entry)
        else:
            heapq.heappush(self._ready, entry)

    def _blocked(self, inst: _Instance) -> bool:
        """An older queued call with real asks shares a rank with ``inst`` (FCFS)."""
        job_id = inst.group.job_id
        lines = self._lines
        for r in inst.group.members:
            head = lines[r][job_id].head()
            if head is not None and head is not inst:
                return True
        return False

    def _settled(self, inst: _Instance) -> bool:
        """``inst`` waited (no plan) and nothing its plan depends on changed since."""
        t = inst.settled_tick
        if t < self._all_tick or t < inst.group.touch_tick:
            return False
        rank_tick = self._rank_tick
        return all(rank_tick.get(r, -1) <= t for r in inst.group.members)

    def _touch_circuits(self, circuits: Iterable[Circuit]) -> None:
        """Circuits changed (added, removed, protected, released): queued calls on the ranks
        at their ends may go now (ports name their owner rank)."""
        for c in circuits:
            self._touch_port((c.rail, c.port_a))
            self._touch_port((c.rail, c.port_b))

    def _touch_port(self, key: tuple[int, int]) -> None:
        """A port changed: look again at the queued calls whose plan may use it."""
        o = self._owner.get(key)
        if o is not None:
            self._touch_rank(o[1])
        groups = self._cached_at.get(key)
        if groups:
            for grp in groups:
                self._tick += 1
                grp.touch_tick = self._tick
                for inst in grp.instances.values():
                    if inst.in_queue:
                        self._reconsider(inst)

    def _cache_foreign(self, grp: _Group, c: Circuit) -> None:
        """``grp`` cached a circuit on ports none of its members owns (another job's ranks of
        the same numbers lit it): changes there concern its queued calls too."""
        for key in ((c.rail, c.port_a), (c.rail, c.port_b)):
            self._cached_at.setdefault(key, set()).add(grp)

    def _touch_rank(self, rank: int) -> None:
        self._tick += 1
        self._rank_tick[rank] = self._tick
        by_job = self._lines.get(rank)
        if by_job:
            for line in by_job.values():
                head = line.head()
                if head is not None:
                    self._reconsider(head)  # any later call on this rank is blocked by it
                else:
                    for s in line.specs:
                        self._reconsider(s)

    def _touch_all(self) -> None:
        """Every port may have changed (their owners did): look at every queued call again."""
        self._tick += 1
        self._all_tick = self._tick
        for inst in self._queue:
            self._reconsider(inst)

    def _dispatch(self, inst: _Instance, plan: list[Reconfiguration], now: float,
                  out: Output) -> None:
        did = self._next_decision
        self._next_decision += 1
        grp = inst.group
        spec = not inst.real
        reconfs = tuple(plan)
        decision = Decision(did, grp.job_id, grp.group_id, inst.seq, reconfs, spec)
        inst.state = _State.SWITCHING
        inst.decision_id = did
        inst.spec_tried = inst.spec_tried or spec
        self._inflight[did] = (decision, inst)
        self.counters["decisions"] += 1
        self.counters["reconfigurations"] += len(plan)
        if spec:
            self.counters["speculative_decisions"] += 1
        out.decisions.append(decision)
        out._events.append((_ev_decision, now, did, grp.job_id, grp.group_id, inst.seq, spec,
                            reconfs, now - inst.t_first_s))
        keys = self._dark_keys.setdefault(did, [])
        dark = self._dark
        for rc in plan:
            self._commit(rc)
            rail = rc.rail
            touched = {p for c in rc.add for p in (c.port_a, c.port_b)}
            touched.update([p for c in rc.remove for p in (c.port_a, c.port_b)])
            for p in touched:
                dark[(rail, p)] = did
                keys.append((rail, p))
            out._events.append((_ev_reconfig_start, now, did, rc, touched))
        self._version += 1

    def _undark(self, decision_id: int) -> None:
        dark = self._dark
        keys = self._dark_keys.pop(decision_id, ())
        for key in keys:
            if dark.get(key) == decision_id:  # not re-targeted by a later decision
                del dark[key]
        if self._queue:
            circ_at = self._circ_at
            for key in keys:
                self._touch_port(key)
                c = circ_at.get(key)  # (maybe restored by an undo while the port was dark)
                if c is not None:
                    self._touch_port((c.rail, c.port_b if key[1] == c.port_a else c.port_a))
        self._version += 1

    def _commit(self, rc: Reconfiguration) -> None:
        self._settle()
        self.state.apply(rc)
        pairs = self._pairs
        owner_get = self._owner.get
        last_used = self._last_used_s
        served = self._served_axis
        circ_at = self._circ_at
        rail = rc.rail
        for c in rc.remove:
            pa, pb = c.port_a, c.port_b
            circ_at.pop((rail, pa), None)
            circ_at.pop((rail, pb), None)
            # the rank-pair key, as _pair_key computes it
            oa, ob = owner_get((rail, pa)), owner_get((rail, pb))
            a = oa[1] if oa else -pa - 1
            b = ob[1] if ob else -pb - 1
            key = (rail, a, b) if a < b else (rail, b, a)
            s = pairs.get(key)
            if s is not None:
                s.discard(c)
                if not s:
                    del pairs[key]
            if last_used:
                last_used.pop(c, None)
            if served:
                served.pop(c, None)
        for c in rc.add:
            pa, pb = c.port_a, c.port_b
            circ_at[(rail, pa)] = c
            circ_at[(rail, pb)] = c
            oa, ob = owner_get((rail, pa)), owner_get((rail, pb))
            a = oa[1] if oa else -pa - 1
            b = ob[1] if ob else -pb - 1
            key = (rail, a, b) if a < b else (rail, b, a)
            s = pairs.get(key)
            if s is None:
                pairs[key] = {c}
            else:
                s.add(c)
        if self._queue:
            self._touch_circuits(rc.remove)
            self._touch_circuits(rc.add)
        self._version += 1

    def _rekey_pairs(self) -> None:
        """Rebuild the rank-pair index after port ownership changed."""
        self._pairs = {}
        circ_at = self._circ_at
        for c in self.state.all_circuits():
            c = circ_at.get((c.rail, c.port_a), c)  # the object the other indexes hold
            self._pairs.setdefault(self._pair_key(c, self._owner), set()).add(c)
        if self._queue:
            self._touch_all()
        self._version += 1

    @staticmethod
    def _pair_key(c: Circuit, owner: Mapping[tuple[int, int], tuple[str, int]]
                  ) -> tuple[int, int, int]:
        oa = owner.get((c.rail, c.port_a))
        ob = owner.get((c.rail, c.port_b))
        a = oa[1] if oa else -c.port_a - 1  # unowned ports never match a rank pair
        b = ob[1] if ob else -c.port_b - 1
        return (c.rail, a, b) if a < b else (c.rail, b, a)

    def _plan(self, grp: _Group, now: float) -> list[Reconfiguration] | None:
        """The minimal per-rail changes that light the group's demand, or None if it must wait."""
        self._settle()
        ports_of = self._jobs[grp.job_id].ports
        circ_at = self._circ_at
        dark = self._dark
        protect = self._protect
        pairs = self._pairs
        cache = grp.cache
        pick = self._pick
        degree_aware = self.config.degree_aware
        plan = []
        for rail, keys in grp.rail_keys:
            keep: set[Circuit] = set()
            missing: list[tuple[int, Edge]] = []
            for pair_key, cache_key in keys:
                cands = pairs.get(pair_key)
                if cands:
                    c = pick(rail, cache_key, cands, cache, dark)
                    if c is None:
                        return None  # its circuit is being switched on: wait for the light
                    keep.add(c)
                else:
                    missing.append(cache_key)
            if not missing:
                continue
            taken: set[int] = set()
            for c in keep:
                taken.add(c.port_a)
                taken.add(c.port_b)
            remove: set[Circuit] = set()
            if not degree_aware:  # base mode: the other parallelisms' idle circuits go
                idle_extra: set[Circuit] = set()
                for port_key in grp.port_keys[rail]:
                    c_at = circ_at.get(port_key)
                    if c_at is None:
                        continue
                    if c_at in keep or c_at in protect or (dark and (
                            (rail, c_at.port_a) in dark or (rail, c_at.port_b) in dark)):
                        continue
                    idle_extra.add(c_at)
                axis = grp.axis
                served_get = self._served_axis.get
                for c in idle_extra:  # (in idle_extra's order, as a set comprehension would)
                    if not axis or served_get(c) != axis:
                        remove.add(c)

            rp = _RailPlan(rail, circ_at, dark, protect, keep, taken, remove, self._last_used_s)
            usable, free_port = rp.usable, rp.free_port

            add: list[Circuit] = []
            for cache_key in missing:
                a, b = cache_key[1]
                cached = cache.get(cache_key)
                new_c: Circuit | None = None
                if cached is not None and usable(cached.port_a) and usable(cached.port_b):
                    pa, pb = cached.port_a, cached.port_b
                    new_c = cached  # (the circuit it would build: equal, and already there)
                else:
                    pa_opt = free_port(ports_of[a])
                    if pa_opt is None:
                        return None
                    taken.add(pa_opt)
                    pb_opt = free_port(ports_of[b])
                    taken.discard(pa_opt)
                    if pb_opt is None:
                        return None
                    pa, pb = pa_opt, pb_opt
                for p in (pa, pb):
                    c_at = circ_at.get((rail, p))
                    if c_at is not None:
                        remove.add(c_at)
                    taken.add(p)
                add.append(new_c if new_c is not None else Circuit(rail, pa, pb))
            plan.append(Reconfiguration(rail, add=frozenset(add), remove=frozenset(remove)))
        return plan

    # ------------------------------------------------------------ rail-state

    def predict(self, intent: Intent, now: float) -> Output:
        """A rank names its next call ahead of time (provisioning under rail-state, from the
        plan): a speculative ask. Ignored, with an event, when provisioning is off; a prediction
        of a call the rank asked for or finished already is counted and dropped."""
        out = Output()
        if not self.config.provisioning:
            out._events.append({"event": "prediction_ignored", "t_s": now,
                               "reason": "provisioning is off", **intent.to_json()})
            return out
        job = self._jobs.get(intent.job_id)
        grp = job.groups.get(intent.group_id) if job is not None else None
        if self._rs is not None and job is not None and grp is not None:
            inst = grp.instances.get(intent.seq)
            if (intent.seq <= grp.done_seq.get(intent.rank, -1)
                    or (inst is not None and intent.rank in inst.real)):
                self.counters["late_predictions"] += 1
                return out
        self._speculate(intent, now, out, None)
        return out

    def _rs_new_job(self, job: JobSpec) -> _RailStateJob:
        """The bit model of a job, or :class:`JobError` naming what the model cannot hold."""
        if self._jobs:
            raise JobError(f"job {job.job_id}: rail-state keeps one bit state per rail, so one "
                           f"job per controller (job {next(iter(self._jobs))} is registered)")
        n_rails, n_bits = job_shape(job)
        assert job.stages is not None  # job_shape checked
        shadow: dict[Bit, int] = {}
        for rail in range(n_rails):
            for bit in range(n_bits):
                sid = shadow_rail_id(rail, bit, n_rails, n_bits)
                desc = self.rails.get(sid)
                if desc is None or desc.mode != "ocs" or tuple(desc.ports) != SHADOW_PORTS:
                    raise JobError(f"job {job.job_id}: rail-state switches bit {bit} of rail "
                                   f"{rail} on shadow rail {sid} (an OCS with ports "
                                   f"{list(SHADOW_PORTS)}), which the OCS does not have")
                shadow[(rail, bit)] = sid
        data_ocs = sorted({rp.rail for rp in job.ranks.values()} & self.optical)
        if data_ocs:
            raise JobError(f"job {job.job_id}: rail-state carries the data on packet-switched "
                           f"(electrical) rails and switches only shadow rails, but rails "
                           f"{data_ocs} of its ranks are OCS rails")
        ops: dict[str, dict[int, BitOp]] = {}
        for gid, grp in job.groups.items():
            rails = list(job.demand[gid])
            if rails:
                op = bit_op_of(grp, job.stages)
                ops[gid] = dict.fromkeys(rails, op)
        model = RailStateModel(range(n_rails), self.config.rail_state_inflight)
        return _RailStateJob(job.job_id, model, ops, shadow)

    def _rs_intent(self, rs: _RailStateJob, grp: _Group, inst: _Instance | None,
                   intent: Intent, now: float, ref: object, out: Output) -> None:
        if inst is None:
            inst = self._new_instance(grp, intent.seq, now)
        inst.kind, inst.size_bytes, inst.axis = intent.kind, intent.size_bytes, intent.axis
        inst.spec.discard(intent.rank)
        inst.real[intent.rank] = ref
        if inst.state is _State.ACTIVE:  # served and lit: acked at once (also if provisioned)
            self._ack(inst, out, now, False)
        elif inst.state is _State.GATHER:
            self._rs_gathered(rs, inst, now, out)

    def _rs_gathered(self, rs: _RailStateJob, inst: _Instance, now: float, out: Output) -> None:
        """Serve the call once every member asked (really or speculatively)."""
        if inst.asked < inst.group.n_members:
            return
        grp = inst.group
        rid = rs.next_request
        rs.next_request += 1
        served = rs.model.serve(rid, rs.ops.get(grp.group_id, {}))
        self.counters["stale_reflips"] += served.stale_bits - served.joined_bits
        self.counters["rail_state_joined_bits"] += served.joined_bits
        self.counters["rail_state_early_bits"] += served.early_bits
        out._events.append({
            "event": "rail_state_served", "t_s": now, "job": grp.job_id, "group": grp.group_id,
            "seq": inst.seq, "speculative": not inst.real,
            "requested": {str(r): m for r, m in served.requested.items()},
            "completed": {str(r): m for r, m in served.completed.items()},
            "bits": sorted([r, b] for r, b in served.request.bits) if served.request else [],
            "stale_bits": served.stale_bits, "joined_bits": served.joined_bits,
            "early_bits": served.early_bits})
        if served.request is None:
            inst.state = _State.ACTIVE
            self.counters["acked_at_once"] += 1
            self._ack(inst, out, now, False)
            return
        inst.state = _State.SWITCHING
        rs.calls[rid] = inst
        for started in served.start:
            self._rs_start(rs, started, now, out)

    def _rs_start(self, rs: _RailStateJob, rid: int, now: float, out: Output) -> None:
        """Switch a request's bits, each on its shadow rail, as one decision."""
        inst = rs.calls[rid]
        req = rs.model.request(rid)
        reconfs = []
        for bit in sorted(req.bits):
            sid = rs.shadow[bit]
            rc = flip_reconf(sid, self.state.circuits(sid))
            self._commit(rc)
            reconfs.append(rc)
        spec = not inst.real
        did = self._rs_decide(rs, inst.group.group_id, inst.seq, tuple(reconfs), spec, now, out,
                              {"bits": sorted([r, b] for r, b in req.bits),
                               "target": {str(r): m for r, m in req.target.items()},
                               "waited_s": now - inst.t_first_s})
        rs.inflight[did] = (rid, tuple(reconfs))
        inst.decision_id = did
        self.counters["decisions"] += 1
        self.counters["reconfigurations"] += len(reconfs)
        self.counters["bit_flips"] += len(reconfs)
        if spec:
            self.counters["speculative_decisions"] += 1

    def _rs_decide(self, rs: _RailStateJob, group_id: str, seq: int,
                   reconfs: tuple[Reconfiguration, ...], speculative: bool, now: float,
                   out: Output, fields: dict[str, object]) -> int:
        did = self._next_decision
        self._next_decision += 1
        out.decisions.append(Decision(did, rs.job_id, group_id, seq, reconfs, speculative))
        out._events.append({"event": "decision", "t_s": now, "decision": did, "job": rs.job_id,
                           "group": group_id, "seq": seq, "speculative": speculative,
                           "rails": [rc.rail for rc in reconfs], "semantics": RAIL_STATE,
                           **fields})
        for rc in reconfs:
            out._events.append({"event": "reconfig_start", "t_s": now, "decision": did,
                               "rail": rc.rail, "ports": sorted(rc.touched_ports),
                               "add": [c.to_json() for c in sorted(rc.add)],
                               "remove": [c.to_json() for c in sorted(rc.remove)]})
        return did

    def _rs_done(self, rs: _RailStateJob, decision_id: int, results: Sequence[ApplyResult],
                 now: float) -> Output:
        """A request's bits lit: ack its call's real askers, start the requests behind it."""
        out = Output()
        rid, _reconfs = rs.inflight.pop(decision_id)
        self._end_events(decision_id, results, now, out)
        started = rs.model.finished(rid)
        self._rs_settle(rs, now, out, "")
        for rid_next in started:
            self._rs_start(rs, rid_next, now, out)
        return out

    def _rs_settle(self, rs: _RailStateJob, now: float, out: Output, error: str) -> None:
        """Ack the calls whose own and joined switches have all lit; fail the others."""
        for rid, ok in rs.model.settled():
            inst = rs.calls.pop(rid)
            grp = inst.group
            if not ok:
                for _rank, ref in inst.real.items():
                    self._reject(out, now, ref, "reconfig_failed",
                                 f"switching for group {grp.group_id} failed: "
                                 f"{error or 'a switch it joined failed'}")
                self._drop(inst)
                continue
            if grp.instances.get(inst.seq) is inst and not self._lost_while_switching(inst, now,
                                                                                      out):
                inst.state = _State.ACTIVE
                if inst.real:
                    self._ack(inst, out, now, True)
                else:
                    out._events.append({"event": "provisioned", "t_s": now, "job": grp.job_id,
                                       "group": grp.group_id, "seq": inst.seq})

    def _rs_failed(self, rs: _RailStateJob, decision_id: int, error: str, now: float,
                   withdrawn: bool = False) -> Output:
        """A rail-state decision failed: undo its flips, fail its call, free its bits."""
        out = Output()
        rid, reconfs = rs.inflight.pop(decision_id)
        event: dict[str, object] = {"event": "reconfig_failed", "t_s": now,
                                    "decision": decision_id, "error": error}
        if withdrawn:
            event["withdrawn"] = True
        out._events.append(event)
        for rc in reconfs:
            self._undo(decision_id, rc, now, out)
        started = rs.model.finished(rid, lit=False)
        self._rs_settle(rs, now, out, error)
        for rid_next in started:
            self._rs_start(rs, rid_next, now, out)
        return out

    # ---------------------------------------------------------------- views

    def active_circuits(self) -> frozenset[Circuit]:
        """Circuits that running calls use now (never touched by a decision)."""
        self._settle()
        return frozenset(self._protect)

    def dark_ports(self) -> frozenset[tuple[int, int]]:
        return frozenset(self._dark)

    def pending(self) -> list[tuple[str, str, int, str]]:
        """(job, group, seq, state) of every call not finished yet, for diagnostics."""
        return [(g.job_id, g.group_id, i.seq, i.state.value)
                for j in self._jobs.values() for g in j.groups.values()
                for i in g.instances.values()]


@dataclass(slots=True)
class _RailPlan:
    """Port choice on one rail while planning: which ports a new circuit may use."""

    rail: int
    circ_at: Mapping[tuple[int, int], Circuit]  # (rail, port) -> its circuit (OpusCore._circ_at)
    dark: Mapping[tuple[int, int], int]
    protect: Mapping[Circuit, int]
    keep: set[Circuit]
    taken: set[int]
    remove: set[Circuit]
    last_used_s: Mapping[Circuit, float]

    def usable(self, p: int) -> bool:
        """Free, being freed, or holding an idle circuit that may be evicted."""
        if p in self.taken:
            return False
        c = self.circ_at.get((self.rail, p))
        if c is None:
            return True  # idle, or being freed by a switch in flight (re-targeted)
        dark = self.dark
        if dark and ((self.rail, c.port_a) in dark or (self.rail, c.port_b) in dark):
            return False  # being lit for another call
        return c in self.remove or (c not in self.keep and c not in self.protect)

    def free_port(self, ports: Sequence[int]) -> int | None:
        """An idle port, else one whose circuit goes anyway, else the least recently used."""
        best: int | None = None
        best_key = (2, 0.0)
        for p in ports:
            if not self.usable(p):
                continue
            c = self.circ_at.get((self.rail, p))
            if c is None:
                return p
            key = (0, 0.0) if c in self.remove else (1, self.last_used_s.get(c, float("-inf")))
            if key < best_key:
                best, best_key = p, key
        return best
