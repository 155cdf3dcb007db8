"""First-come-first-served for the port-exact planner: per-rank wait lines of queued calls, and
change ticks that say which queued calls to look at again.

A queued call is looked at again only when something its plan depends on changed (a port of
one of its ranks, the port owners, or an older call that blocked it on a shared rank left the
queue); :mod:`controller.portexact` states the rule and why it decides as the full scan would.
:class:`FcfsQueue` is the planner's base class, not an object of its own: the planner's hot
paths call these methods on ``self``, with no lookup more than before the split.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controller.instances import CallState, Group, Instance
from controller.ocs import Circuit
from controller.output import Output


@dataclass(eq=False, slots=True)
class _WaitLine:
    """The queued calls of one job that involve one rank: first-come-first-served is per rank.

    ``reals``: a heap of ``(order, call)`` of the calls with real asks; entries of calls that
    left the queue are dropped lazily. ``specs``: the calls only speculative asks made ready.
    """

    reals: list[tuple[int, Instance]] = field(default_factory=list)
    specs: dict[Instance, None] = field(default_factory=dict)

    def head(self) -> Instance | None:
        """The oldest queued call with real asks: it blocks every later call on this rank."""
        reals = self.reals
        while reals:
            order, inst = reals[0]
            if inst.in_queue and inst.order == order:
                return inst
            heapq.heappop(reals)
        return None


class FcfsQueue:
    """The queued calls, their wait lines and change ticks (a base of the planner)."""

    _owner: Mapping[tuple[int, int], tuple[str, int]]  # (the planner's: port owners)

    def __init__(self) -> None:
        self._queue: dict[Instance, None] = {}  # the QUEUED calls
        self._lines: dict[int, dict[str, _WaitLine]] = {}  # rank -> job -> its queued calls
        # queued calls to look at again, as a heap in FCFS order ((not real, order), ...);
        # a call touched during a scan before the scan's position waits for the next pump
        self._ready: list[tuple[bool, int, int, Instance]] = []
        self._later: list[tuple[bool, int, int, Instance]] = []
        self._scan_key: tuple[bool, int] | None = None
        self._entry_ids = itertools.count()
        # change ticks: per rank (of any job: rank pairs index circuits), and of all ports
        self._tick = 0
        self._rank_tick: dict[int, int] = {}
        self._all_tick = 0
        # (rail, port) -> groups whose circuit cache holds a circuit on that port although no
        # member owns it (rank pairs match ranks of any job): planning may reuse it
        self._cached_at: dict[tuple[int, int], set[Group]] = {}

    def _serve(self, inst: Instance, now: float, out: Output) -> bool:
        """Serve a ready call if it can go now (the planner's)."""
        raise NotImplementedError

    def _queued_conflict(self, inst: Instance) -> bool:
        """A queued call of the job with real asks shares a rank with ``inst``."""
        job_id = inst.group.job_id
        lines = self._lines
        for r in inst.group.members:
            by_job = lines.get(r)
            line = by_job.get(job_id) if by_job else None
            if line is not None and line.head() is not None:
                return True
        return False

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

    def _enqueue(self, inst: Instance) -> None:
        """Queue a ready call (its ``order`` set): it waits in the line of each of its ranks."""
        inst.state = CallState.QUEUED
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

    def _dequeue(self, inst: Instance) -> None:
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

    def _queued_turns_real(self, inst: Instance) -> None:
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

    def _reconsider(self, inst: Instance) -> None:
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

    def _blocked(self, inst: Instance) -> bool:
        """An older queued call with real asks shares a rank with ``inst`` (FCFS)."""
        job_id = inst.group.job_id
        lines = self._lines
        for r in inst.group.members:
            head = lines[r][job_id].head()
            if head is not None and head is not inst:
                return True
        return False

    def _settled(self, inst: Instance) -> bool:
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

    def _cache_foreign(self, grp: Group, c: Circuit) -> None:
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
