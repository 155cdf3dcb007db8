"""The port-exact switching model: circuits are port matchings under the one-to-one rule, as on
a real OCS (``CoreConfig.semantics`` ``port-exact``, the default).

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

FCFS in time that does not grow with the queue: a queued call is looked at again only when
something it depends on changed — a port of one of its ranks (a circuit added, removed,
darkened, lit, protected or released; ports name their owner rank), the port owners (a job
registered or unregistered), or an older call that blocked it on a shared rank left the
queue. Every other queued call would wait again if looked at (its plan fails as before, or
an older call still blocks it), so the full scan of the paper's FCFS rule and this one make
the same decisions in the same order (the golden traces pin it).

The planner gets what it needs from the book as a :class:`~controller.switching.BookView` in
its constructor (the jobs and port owners as read-only mappings, the counters, the crossconnect
state, the book's actions ``ack``, ``finish``, ...) and keeps each as an attribute of its own:
one attribute lookup per call, as when both were one class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from controller.fcfs import FcfsQueue
from controller.instances import CallState, Group, Instance, JobEntry
from controller.job import Edge, JobSpec
from controller.messages import Decision, Event
from controller.ocs import ApplyResult, Circuit, Reconfiguration
from controller.output import LazyEvent, Output
from controller.switching import BookView, end_events, undo

_ACTIVE = CallState.ACTIVE  # (a module constant: read per call)


# Builders of the decisions' lazily recorded events (controller.output.LazyEvent): a decision
# costs a tuple per rail until someone reads Output.events; each builder turns its record into
# the dict the core used to build on the spot, with the same keys in the same order.

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


class PortExactPlanner(FcfsQueue):
    """The port-exact switching model (see the module docstring; the interface is
    :class:`controller.switching.SwitchingModel`)."""

    #: (controller.switching.SwitchingModel) real asks withdraw predictions; completions carry
    #: them; a late prediction is an ordinary one (ignored with an event, or already asked)
    withdraws_predictions = True
    predicts_on_completion = True
    counts_late_predictions = False
    gate = None  # (SwitchingModel) no request waits for another at the controller

    def __init__(self, view: BookView) -> None:
        super().__init__()
        self.config = view.config
        self.state = view.state
        self.counters = view.counters
        self._jobs = view.jobs
        self._owner = view.owners  # (rail, port) -> (job, rank): ports name their owner rank
        self._ack = view.ack
        self._finish = view.finish
        self._reject = view.reject
        self._drop = view.drop
        self._lost_while_switching = view.lost_while_switching
        self._pairs: dict[tuple[int, int, int], set[Circuit]] = {}  # (rail, rank a, rank b)
        # (rail, port) -> the circuit on it, mirroring self.state (which only _commit changes):
        # planning then finds the existing Circuit object instead of building an equal one
        self._circ_at: dict[tuple[int, int], Circuit] = {}
        self._protect: dict[Circuit, int] = {}
        self._dark: dict[tuple[int, int], int] = {}  # (rail, port) -> decision id
        self._dark_keys: dict[int, list[tuple[int, int]]] = {}
        self._inflight: dict[int, tuple[Decision, Instance]] = {}
        self._last_used_s: dict[Circuit, float] = {}
        self._served_axis: dict[Circuit, str] = {}  # the parallelism a circuit last carried
        # Deferred bookkeeping (_settle): calls activated whose circuits _protect does not count
        # yet, and per circuit set released (a running call's end) its axis and time, oldest
        # first, not yet written to _served_axis / _last_used_s. Planning and commits read
        # these tables and settle them first; a call that ends before anyone looked costs no
        # per-circuit work at all (most calls: their circuits are lit, nobody plans meanwhile).
        self._protect_due: dict[Instance, frozenset[Circuit]] = {}
        self._release_due: dict[frozenset[Circuit], tuple[str, float]] = {}
        # circuits a failed decision could not restore (their port was claimed by a later
        # decision): still on the switch; taken back once a later undo frees their ports
        self._diverged: set[Circuit] = set()
        # (rail, job, rank) -> the group that used the rank's circuits on that rail last
        self._last_group: dict[tuple[int, str, int], Group] = {}
        self._version = 0
        self._order = 0
        self._next_decision = 1
        self.waiting = self._queue  # (SwitchingModel: the book pumps when calls wait)

    # ------------------------------------------------------------------ jobs

    def prepare_job(self, job: JobSpec) -> Callable[[JobEntry, float, Output], None]:
        """Any job the book accepts fits port matchings: nothing more to check."""
        return self._job_added

    def _job_added(self, jb: JobEntry, now: float, out: Output) -> None:
        """Precompute the ports of each group's ranks and index the circuits by rank pair."""
        for g in jb.groups.values():
            g.port_keys = {rail: tuple((rail, p) for r in ranks for p in jb.ports[r])
                           for rail, ranks in g.rail_ranks.items()}
        self._rekey_pairs()

    def job_removed(self, job: JobEntry) -> None:
        """Forget the job's queued calls, wait lines and cached foreign circuits; re-index."""
        job_id = job.spec.job_id
        for inst in [i for i in self._queue if i.group.job_id == job_id]:
            del self._queue[inst]  # (its state stays QUEUED: its group is dead)
            inst.in_queue = inst.in_ready = False
        for by_job in self._lines.values():
            by_job.pop(job_id, None)
        for groups in self._cached_at.values():
            groups.difference_update(job.groups.values())
        self._rekey_pairs()

    # ------------------------------------------------------- driver feedback

    def done(self, decision_id: int, results: Sequence[ApplyResult], now: float) -> Output:
        """The driver lit the circuits of a decision: ack its waiting ranks, serve the queue."""
        out = Output()
        entry = self._inflight.pop(decision_id, None)
        if entry is None:
            return out
        _decision, inst = entry
        self._undark(decision_id)
        end_events(decision_id, results, now, out)
        if not inst.group.alive:
            self._orphaned(decision_id, inst, "done", now, out)
        elif inst.group.instances.get(inst.seq) is inst:
            inst.state = CallState.GATHER
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
                out.emit((_ev_provisioned, now, inst.group.job_id,
                          inst.group.group_id, inst.seq))
                if not inst.spec and not inst.real:
                    self._drop(inst)
        self._pump(now, out)
        return out

    def failed(self, decision_id: int, error: str, now: float, out: Output,
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
        out.emit(event)
        for rc in decision.reconfs:
            self._diverged.update(undo(self.state, self._commit, decision_id, rc, now, out))
        if self._diverged:
            self._restore_diverged(decision_id, now, out)
        if not inst.group.alive:  # its ranks were told at unregister_job
            self._orphaned(decision_id, inst, "failed", now, out)
            return
        for _rank, ref in inst.real.items():
            self._reject(out, now, ref, "reconfig_failed",
                         f"switching for group {inst.group.group_id} failed: {error}")
        self._drop(inst)

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
            out.emit({"event": "state_restored", "t_s": now, "decision": decision_id,
                     "rail": rail, "restored": [c.to_json() for c in
                                                sorted(mine)]})
        self._diverged -= back

    @staticmethod
    def _orphaned(decision_id: int, inst: Instance, outcome: str, now: float,
                  out: Output) -> None:
        """A decision of an unregistered job ended: the crossconnect state already follows the
        driver (committed at dispatch, undone on failure) and its dark ports are released; the
        dead job's call is not served, told or otherwise touched."""
        grp = inst.group
        out.emit({"event": "orphaned_decision", "t_s": now, "decision": decision_id,
                 "job": grp.job_id, "group": grp.group_id, "seq": inst.seq,
                 "outcome": outcome})


    # ------------------------------------------------------------- serving

    def _advance(self, inst: Instance, now: float, out: Output) -> None:
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

    def _lit(self, grp: Group) -> frozenset[Circuit] | None:
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

    def _activate(self, inst: Instance, circuits: frozenset[Circuit], now: float, out: Output,
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
            out.emit({"event": "reconfig_avoided", "t_s": now, "job": grp.job_id,
                     "group": grp.group_id, "seq": inst.seq,
                     "rails": sorted(avoided_rails)})
        self._ack(inst, out, now, reconfigured)
        if len(inst.completed) >= grp.n_members:
            self._finish(inst, now, out)

    def _unprotect(self, inst: Instance, now: float) -> None:
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

    # ------------------------------------------------------------- planning

    def _serve(self, inst: Instance, now: float, out: Output) -> bool:
        """Serve a ready call if it can go now (a queued one leaves the queue): ack it when its
        circuits are lit, switch them when a plan fits; False when it has to wait."""
        grp = inst.group
        lit = self._lit(grp)
        if lit is not None:
            if inst.in_queue:
                self._dequeue(inst)
            inst.state = CallState.GATHER
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

    def _dispatch(self, inst: Instance, plan: list[Reconfiguration], now: float,
                  out: Output) -> None:
        did = self._next_decision
        self._next_decision += 1
        grp = inst.group
        spec = not inst.real
        reconfs = tuple(plan)
        decision = Decision(did, grp.job_id, grp.group_id, inst.seq, reconfs, spec)
        inst.state = CallState.SWITCHING
        inst.decision_id = did
        inst.spec_tried = inst.spec_tried or spec
        self._inflight[did] = (decision, inst)
        self.counters["decisions"] += 1
        self.counters["reconfigurations"] += len(plan)
        if spec:
            self.counters["speculative_decisions"] += 1
        out.decisions.append(decision)
        out.emit((_ev_decision, now, did, grp.job_id, grp.group_id, inst.seq, spec,
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
            out.emit((_ev_reconfig_start, now, did, rc, touched))
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

    def _plan(self, grp: Group, now: float) -> list[Reconfiguration] | None:
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

    def commit(self, rc: Reconfiguration) -> None:
        """Take a change of the switch into the state and the indexes (initial circuits)."""
        self._commit(rc)

    # (controller.switching.SwitchingModel) the hooks the book calls, under their own names
    asked = _advance
    released = _unprotect
    withdraw = FcfsQueue._dequeue
    turned_real = FcfsQueue._queued_turns_real
    pump = FcfsQueue._pump

    # ---------------------------------------------------------------- views

    def active_circuits(self) -> frozenset[Circuit]:
        """Circuits that running calls use now (never touched by a decision)."""
        self._settle()
        return frozenset(self._protect)

    def dark_ports(self) -> frozenset[tuple[int, int]]:
        return frozenset(self._dark)


@dataclass(slots=True)
class _RailPlan:
    """Port choice on one rail while planning: which ports a new circuit may use."""

    rail: int
    circ_at: Mapping[tuple[int, int], Circuit]  # (rail, port) -> its circuit (planner's _circ_at)
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
