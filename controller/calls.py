r"""The calls of the Opus core: instances, gathering, acks and completions, lost ranks,
speculation, and :class:`Output` with its events. Shared by every switching model.

A collective call of a comm group is an *instance* ``(job, group, seq)``; ``seq`` counts the
group's calls at each rank, so all members name the same call with the same number. As in the
paper, an instance is served once all its members have asked; with provisioning, speculative asks
count too, so the switch can start before the real intents arrive. The ack goes to every member
once all have really asked and the circuits are lit; until then no member can move data, so early
members lose nothing by waiting, and a call holds (protects) circuits only while it can actually
run, which keeps valid programs free of controller-induced deadlock. Life cycle::

    GATHER --all members asked--> QUEUED --plan fits--> SWITCHING --light--> ACTIVE --all done-->
       \-- all asked really and circuits already lit ---------------------> ACTIVE

:class:`CallBook` keeps the jobs and their calls and hands a call to the switching model
(:class:`controller.switching.SwitchingModel`) whenever it got an ask while gathering; serving,
switching and provisioning are the model's. The book calls the model through bound methods it
keeps as its own attributes (``_asked``, ``_released``, ...), so a hook costs what a method of
the book would: the hot paths (one intent, one completion) pay no extra lookup for the split.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, overload

from controller.job import Edge, JobError, JobSpec
from controller.messages import Ack, CoreConfig, Decision, Event, Intent, Reject
from controller.ocs import (
    ApplyResult,
    Circuit,
    CrossconnectState,
    RailDescription,
    Reconfiguration,
)

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


class CallState(enum.Enum):
    """Where a call is in its life cycle (the module docstring draws it)."""

    GATHER = "gather"
    QUEUED = "queued"
    SWITCHING = "switching"
    ACTIVE = "active"


_ACTIVE, _GATHER = CallState.ACTIVE, CallState.GATHER  # (module constants: read per intent)


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


class CallBook:
    """The jobs and their calls, for one set of rails; the switching model does the rest.

    :class:`controller.core.OpusCore` is the book with its model chosen; :meth:`_use` binds the
    model's hooks (see the module docstring for why they are bound, not looked up).
    """

    def __init__(self, rails: Sequence[RailDescription], config: CoreConfig | None = None) -> None:
        self.config = config or CoreConfig()
        self.rails = {r.rail: r for r in rails}
        self.optical = {r.rail for r in rails if r.mode == "ocs"}
        self.state = CrossconnectState({r.rail: r.ports for r in rails})
        self._owner: dict[tuple[int, int], tuple[str, int]] = {}  # (rail, port) -> (job, rank)
        self._jobs: dict[str, JobEntry] = {}
        # (job, rank) -> the calls it asked for speculatively, in the order it asked
        self._spec_of: dict[tuple[str, int], dict[Instance, None]] = {}
        self.counters: dict[str, int] = {
            "intents": 0, "acks": 0, "decisions": 0, "reconfigurations": 0,
            "avoided_reconfigurations": 0, "speculative_decisions": 0, "mispredictions": 0,
            "rejects": 0,
        }

    def _use(self, model: SwitchingModel) -> None:
        """Serve calls with ``model``: keep its hooks as bound methods of our own."""
        self._model = model
        self._waiting: Mapping[Instance, None] = model.waiting
        self._asked: Callable[[Instance, float, Output], None] = model.asked
        self._released: Callable[[Instance, float], None] = model.released
        self._withdraw: Callable[[Instance], None] = model.withdraw
        self._turned_real: Callable[[Instance], None] = model.turned_real
        self._pump: Callable[[float, Output], None] = model.pump
        self._withdraws_predictions = model.withdraws_predictions
        self._gate: RequestGate | None = model.gate
        self._completion_predicts = self.config.provisioning and model.predicts_on_completion

    # ------------------------------------------------------------------ jobs

    def register_job(self, job: JobSpec, now: float, ref: object = None) -> Output:
        """Add a job; a clash with the rails or another job's ports is rejected, nothing changes."""
        out = Output()
        try:
            self._check_job(job)
            added = self._model.prepare_job(job)
        except JobError as exc:
            return self._reject(out, now, ref, "bad_job", str(exc), job=job.job_id)
        groups = {}
        for gid, grp in job.groups.items():
            demand = {rail: edges for rail, edges in job.demand[gid].items()
                      if rail in self.optical}
            groups[gid] = Group(job.job_id, gid, grp.axis, frozenset(grp.ranks), demand)
        self._jobs[job.job_id] = jb = JobEntry(job, groups)
        for rank_ports in job.ranks.values():
            for p in rank_ports.ports:
                self._owner[(rank_ports.rail, p)] = (job.job_id, rank_ports.rank)
        added(jb)
        out._events.append({"event": "job_registered", "t_s": now, "job": job.job_id,
                           "ranks": len(job.ranks), "groups": len(job.groups)})
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
        for grp in job.groups.values():
            grp.alive = False
            for inst in grp.instances.values():
                for rank, ref in inst.real.items():
                    if rank not in inst.acked:
                        self._reject(out, now, ref, "job_unregistered",
                                     f"job {job_id} was unregistered")
                if inst.state is CallState.ACTIVE:
                    self._released(inst, now)
        for key in [k for k, v in self._owner.items() if v[0] == job_id]:
            del self._owner[key]
        self._model.job_removed(job)
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
        """A rank asks for the circuits of one call; ack now, later, or reject (or, with the
        model's :class:`RequestGate`, hold it until the rank's earlier request is answered)."""
        out = Output()
        if self._gate is not None and self._gate.hold(intent, ref, now, out, True):
            return out
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
        if self._spec_of and self._withdraws_predictions:
            self._cancel_speculation(job.spec.job_id, rank, grp, seq, now, out)
        if inst is None:
            # _new_instance written out: one call fewer per intent (the most frequent input)
            inst = grp.instances[seq] = Instance(grp, seq, now)
        inst.kind, inst.size_bytes, inst.axis = kind, size_bytes, axis
        spec = inst.spec
        if spec:
            spec.discard(rank)
        real = inst.real
        turns_real = not real and inst.in_queue
        real[rank] = ref
        if turns_real:
            self._turned_real(inst)
        state = inst.state
        if state is _ACTIVE:
            self._ack(inst, out, now)
        elif state is _GATHER and len(real) + len(spec) >= grp.n_members:
            self._asked(inst, now, out)  # (it does nothing until everyone asked)
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
        if next_intent is not None and self._completion_predicts:
            self._speculate(next_intent, now, out, ref)
        if self._waiting:
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
                if inst.state is CallState.ACTIVE:
                    inst.completed.add(rank)
                    if len(inst.completed) >= len(grp.members):
                        self._finish(inst, now, out)
                elif inst.state in (CallState.GATHER, CallState.QUEUED):
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

    def _lost_while_switching(self, inst: Instance, now: float, out: Output) -> bool:
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

    # ------------------------------------------------------------ internals

    def _lookup(self, intent: Intent, out: Output, now: float,
                ref: object) -> tuple[JobEntry, Group] | None:
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

    def _new_instance(self, grp: Group, seq: int, now: float) -> Instance:
        inst = Instance(grp, seq, now)
        grp.instances[seq] = inst
        return inst

    def _reject(self, out: Output, now: float, ref: object, code: str, message: str,
                **fields: object) -> Output:
        self.counters["rejects"] += 1
        out.rejects.append(Reject(ref, code, message))
        out._events.append({"event": "error", "t_s": now, "code": code, "message": message,
                           **fields})
        return out

    def _ack(self, inst: Instance, out: Output, now: float, reconfigured: bool = False) -> None:
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

    def _finish(self, inst: Instance, now: float, out: Output) -> None:
        self._released(inst, now)
        self._drop(inst)
        out._events.append((_ev_done, now, inst.group.job_id, inst.group.group_id, inst.seq))

    def _drop(self, inst: Instance) -> None:
        grp = inst.group
        instances = grp.instances
        if instances.get(inst.seq) is inst:
            del instances[inst.seq]
        if inst.in_queue:
            self._withdraw(inst)
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
        if nxt.rank in inst.real or inst.state is CallState.ACTIVE:
            return
        inst.spec.add(nxt.rank)
        self._spec_of.setdefault((nxt.job_id, nxt.rank), {})[inst] = None
        out._events.append({"event": "speculative_intent", "t_s": now, "job": nxt.job_id,
                           "rank": nxt.rank, "group": nxt.group_id, "seq": nxt.seq,
                           "kind": nxt.kind, "size_bytes": nxt.size_bytes})
        if inst.state is CallState.GATHER:
            self._asked(inst, now, out)

    def _cancel_speculation(self, job_id: str, rank: int, grp: Group, seq: int, now: float,
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
            if inst.state is CallState.QUEUED and not inst.ready:
                self._withdraw(inst)
                inst.state = CallState.GATHER
            if inst.state is CallState.GATHER and not inst.real and not inst.spec:
                self._drop(inst)

    # ------------------------------------------------------------- planning

    def predict(self, intent: Intent, now: float) -> Output:
        """A rank names its next call ahead of time (provisioning under rail-state, from the
        plan): a speculative ask. Ignored, with an event, when provisioning is off; where the
        model counts late predictions, one of a call the rank asked for or finished already is
        counted and dropped."""
        out = Output()
        if self._gate is not None and self._gate.hold(intent, None, now, out, False):
            return out
        if not self.config.provisioning:
            out._events.append({"event": "prediction_ignored", "t_s": now,
                               "reason": "provisioning is off", **intent.to_json()})
            return out
        job = self._jobs.get(intent.job_id)
        grp = job.groups.get(intent.group_id) if job is not None else None
        if self._model.counts_late_predictions and job is not None and grp is not None:
            inst = grp.instances.get(intent.seq)
            if (intent.seq <= grp.done_seq.get(intent.rank, -1)
                    or (inst is not None and intent.rank in inst.real)):
                self.counters["late_predictions"] += 1
                return out
        self._speculate(intent, now, out, None)
        return out

    # ---------------------------------------------------------------- views

    def pending(self) -> list[tuple[str, str, int, str]]:
        """(job, group, seq, state) of every call not finished yet, for diagnostics."""
        return [(g.job_id, g.group_id, i.seq, i.state.value)
                for j in self._jobs.values() for g in j.groups.values()
                for i in g.instances.values()]


class RequestGate(Protocol):
    """Holds a rank's requests back while the model says its earlier one is unanswered."""

    def hold(self, intent: Intent, ref: object, now: float, out: Output, real: bool) -> bool:
        """Whether ``intent`` (``real``: an intent, else a prediction) waits (True: the gate
        keeps it and hands it back to the book later); False: the book serves it now."""
        ...


class SwitchingModel(Protocol):
    """What the call book asks of a switching model (each model's docstring says how)."""

    @property
    def waiting(self) -> Mapping[Instance, None]:
        """Calls the model holds back; the book pumps it after a completion only when some
        wait (one check instead of one call per completion)."""
        ...

    #: a rank's real ask for another call withdraws its speculative asks (a misprediction)
    withdraws_predictions: bool
    #: with provisioning, a completion's predicted next call is a speculative ask
    predicts_on_completion: bool
    #: a prediction of a call its rank already asked for or finished is counted and dropped
    counts_late_predictions: bool
    @property
    def gate(self) -> RequestGate | None:
        """Holds a rank's requests back (rail-state's per-rank serialisation), or None."""
        ...

    def prepare_job(self, job: JobSpec) -> Callable[[JobEntry], None]:
        """Check that the model can serve ``job`` (else :class:`~controller.job.JobError`);
        the returned function takes the job in once the book has registered it."""
        ...

    def job_removed(self, job: JobEntry) -> None:
        """Forget an unregistered job (its port owners are gone already)."""
        ...

    def asked(self, inst: Instance, now: float, out: Output) -> None:
        """A gathering call got an ask (real or speculative): serve it once everyone asked."""
        ...

    def released(self, inst: Instance, now: float) -> None:
        """A running call ended (or its job went): its circuits are idle now."""
        ...

    def withdraw(self, inst: Instance) -> None:
        """Take a queued call out of the queue (dropped, or no longer ready)."""
        ...

    def turned_real(self, inst: Instance) -> None:
        """A queued call that only speculative asks made ready got its first real ask."""
        ...

    def pump(self, now: float, out: Output) -> None:
        """Serve the calls that may go now."""
        ...

    def commit(self, rc: Reconfiguration) -> None:
        """Take a change of the switch into the crossconnect state (initial circuits too)."""
        ...

    def done(self, decision_id: int, results: Sequence[ApplyResult], now: float) -> Output:
        """The driver lit a decision's circuits."""
        ...

    def failed(self, decision_id: int, error: str, now: float, out: Output,
               withdrawn: bool) -> None:
        """The driver refused or failed a decision (the book pumps afterwards)."""
        ...

    def active_circuits(self) -> frozenset[Circuit]:
        """Circuits running calls use now (never touched by a decision)."""
        ...

    def dark_ports(self) -> frozenset[tuple[int, int]]:
        """(rail, port) of every port a decision in flight is switching."""
        ...
