"""Discrete-event simulation of ranks, the Opus core and a simulated OCS under a virtual clock.

Each rank runs a program of :class:`Compute` gaps and :class:`Call` collectives, repeated for a
number of iterations. A call asks the core for its circuits (as the shim does), waits for the
ack, starts when its slowest member has joined, lasts ``duration_s`` and completes for all
members at once; with provisioning the completion carries the rank's predicted next call from its
:class:`~controller.profile.CallProfile`. Decisions go to :class:`SimOcsDriver.begin`; the light
comes back after the switching time as a ``reconfig_done`` event.

The simulator also checks the physical invariants independently of the core: a call is never
acknowledged unless its circuits are lit, and no reconfiguration touches a port of a call that has
been acknowledged and not yet completed. Violations are collected in
:attr:`SimResult.violations` (tests assert it is empty).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from controller.clock import VirtualClock
from controller.core import CoreConfig, Event, Intent, OpusCore, Output
from controller.drivers.sim import SimOcsDriver
from controller.job import JobSpec
from controller.ocs import ApplyResult, Circuit, Reconfiguration, ReconfigurationRejected
from controller.profile import CallProfile, CallSignature


@dataclass(frozen=True)
class Compute:
    """Local work: no network for ``duration_s``."""

    duration_s: float


@dataclass(frozen=True)
class Call:
    """A collective call of one comm group, lasting ``duration_s`` once all members joined."""

    group_id: str
    kind: str = "allreduce"
    size_bytes: int = 0
    duration_s: float = 0.0
    axis: str = ""


Op = Compute | Call


@dataclass
class SimResult:
    """What a simulated run produced."""

    end_s: float
    iteration_end_s: dict[int, list[float]]  # rank -> end time of each iteration
    ack_wait_s: list[tuple[int, str, int, int, float]]  # (rank, group, seq, iteration, wait)
    events: list[Event]
    counters: dict[str, int]
    violations: list[str]
    reconfig_rails: int
    driver: SimOcsDriver

    def waits(self, iteration: int | None = None) -> list[float]:
        return [w for (_r, _g, _s, it, w) in self.ack_wait_s if iteration in (None, it)]


@dataclass
class _RankState:
    rank: int
    program: list[tuple[int, Op]]
    pc: int = 0
    profile: CallProfile = field(default_factory=CallProfile)
    seq: dict[str, int] = field(default_factory=dict)
    t_intent_s: float = 0.0
    iteration: int = -1
    iter_end_s: list[float] = field(default_factory=list)


class Simulation:
    """One job on one simulated OCS; build, then :meth:`run`."""

    def __init__(
        self,
        job: JobSpec,
        programs: Mapping[int, Sequence[Op]],
        *,
        iterations: int = 1,
        config: CoreConfig | None = None,
        switching_delay: float | str = 0.0,
        jitter_ms: float = 0.0,
        seed: int = 0,
        rail_ports: Mapping[int, Sequence[int]] | None = None,
        mode: str = "ocs",
        predictor: Callable[[int, CallProfile], CallSignature | None] | None = None,
    ) -> None:
        self.clock = VirtualClock()
        ports = rail_ports or {rail: sorted(ps) for rail, ps in job.ports_by_rail.items()}
        self.driver = SimOcsDriver(ports, switching_delay, clock=self.clock, jitter_ms=jitter_ms,
                                   seed=seed, mode=mode)
        self.core = OpusCore(self.driver.describe(), config)
        self.job = job
        self.config = self.core.config
        self.predictor = predictor
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._tick = itertools.count()
        self.ranks: dict[int, _RankState] = {}
        for r, ops in programs.items():
            prog = [(it, op) for it in range(iterations) for op in ops]
            self.ranks[r] = _RankState(r, prog)
        self.events: list[Event] = []
        self.violations: list[str] = []
        self.ack_wait_s: list[tuple[int, str, int, int, float]] = []
        self._joined: dict[tuple[str, int], set[int]] = {}
        self._in_use: dict[tuple[str, int], frozenset[Circuit]] = {}
        self._open: dict[tuple[str, int], set[int]] = {}
        self.reconfig_rails = 0
        self._absorb(self.core.register_job(job, 0.0))

    # ------------------------------------------------------------ plumbing

    def _at(self, t_s: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t_s, next(self._tick), fn))

    def _absorb(self, out: Output) -> None:
        now = self.clock.now()
        self.events.extend(out.events)
        for rej in out.rejects:
            self.violations.append(f"t={now:.6f}: rejected {rej.code}: {rej.message}")
        for dec in out.decisions:
            self._check_untouched(dec.reconfs, now)
            try:
                results = self.driver.begin(dec.reconfs)
            except ReconfigurationRejected as exc:
                self.violations.append(f"t={now:.6f}: driver rejected decision: {exc}")
                self._absorb(self.core.reconfig_failed(dec.decision_id, str(exc), now))
                continue
            self.reconfig_rails += len(results)
            t_light = max((r.t_light_s for r in results), default=now)
            did = dec.decision_id

            def done(did: int = did, results: list[ApplyResult] = results) -> None:
                self._absorb(self.core.reconfig_done(did, results, self.clock.now()))

            self._at(t_light, done)
        for ack in out.acks:
            self._on_ack(ack.rank, ack.group_id, ack.seq)

    def _check_untouched(self, reconfs: Sequence[Reconfiguration], now: float) -> None:
        for rc in reconfs:
            for key, circuits in self._in_use.items():
                hit = [c for c in circuits if c.rail == rc.rail and set(c.ports) & rc.touched_ports]
                if hit:
                    self.violations.append(
                        f"t={now:.6f}: reconfiguration on rail {rc.rail} touches {hit[0]} of "
                        f"running call {key}")

    def _demand_lit(self, group_id: str) -> frozenset[Circuit] | None:
        demand = self.job.demand[group_id]
        now = self.clock.now()
        used = []
        for rail, edges in demand.items():
            if self.driver.describe()[0].mode != "ocs":
                continue
            lit = self.driver.lit_circuits(rail, now)
            for a, b in edges:
                pa, pb = set(self.job.ranks[a].ports), set(self.job.ranks[b].ports)
                c = next((c for c in lit if (c.port_a in pa and c.port_b in pb)
                          or (c.port_a in pb and c.port_b in pa)), None)
                if c is None:
                    return None
                used.append(c)
        return frozenset(used)

    # ---------------------------------------------------------------- ranks

    def _step(self, r: int) -> None:
        st = self.ranks[r]
        now = self.clock.now()
        if st.pc >= len(st.program):
            st.iter_end_s.append(now)
            return
        it, op = st.program[st.pc]
        if it != st.iteration:
            if st.iteration >= 0:
                st.iter_end_s.append(now)
            st.iteration = it
            st.profile.mark_iteration()
        if isinstance(op, Compute):
            st.pc += 1
            self._at(now + op.duration_s, lambda: self._step(r))
            return
        seq = st.seq.get(op.group_id, 0)
        st.seq[op.group_id] = seq + 1
        st.profile.observe(CallSignature(op.group_id, op.kind, op.size_bytes, op.axis))
        st.t_intent_s = now
        intent = Intent(self.job.job_id, r, op.group_id, seq, op.kind, op.size_bytes, op.axis)
        self._absorb(self.core.intent(intent, now, ref=r))

    def _on_ack(self, r: int, group_id: str, seq: int) -> None:
        st = self.ranks[r]
        now = self.clock.now()
        key = (group_id, seq)
        if key not in self._in_use:
            lit = self._demand_lit(group_id)
            if lit is None:
                self.violations.append(f"t={now:.6f}: rank {r} acked for {key} but not lit")
                lit = frozenset()
            self._in_use[key] = lit
            self._open[key] = set(self.job.groups[group_id].ranks)
        self.ack_wait_s.append((r, group_id, seq, st.iteration, now - st.t_intent_s))
        joined = self._joined.setdefault(key, set())
        joined.add(r)
        members = self.job.groups[group_id].ranks
        if len(joined) == len(members):
            _it, op = st.program[st.pc]
            assert isinstance(op, Call)
            self._at(now + op.duration_s, lambda: self._end_call(group_id, seq))

    def _end_call(self, group_id: str, seq: int) -> None:
        now = self.clock.now()
        key = (group_id, seq)
        for r in self.job.groups[group_id].ranks:
            st = self.ranks[r]
            st.pc += 1
            nxt = self._prediction(st, group_id)
            self._open[key].discard(r)
            if not self._open[key]:
                del self._in_use[key]
            self._absorb(self.core.complete(self.job.job_id, r, group_id, seq, now, ref=r,
                                            next_intent=nxt))
            self._at(now, lambda r=r: self._step(r))  # type: ignore[misc]
        del self._joined[key]

    def _prediction(self, st: _RankState, group_id: str) -> Intent | None:
        if not self.config.provisioning:
            return None
        sig = (self.predictor(st.rank, st.profile) if self.predictor
               else st.profile.predict_next())
        if sig is None or sig.group_id == group_id:
            return None
        return Intent(self.job.job_id, st.rank, sig.group_id, st.seq.get(sig.group_id, 0),
                      sig.kind, sig.size_bytes, sig.axis)

    # ------------------------------------------------------------------ run

    def run(self, until_s: float = 1e9) -> SimResult:
        for r in sorted(self.ranks):
            self._at(0.0, lambda r=r: self._step(r))  # type: ignore[misc]
        while self._heap:
            t_s, _, fn = heapq.heappop(self._heap)
            if t_s > until_s:
                self.violations.append(f"simulation did not finish by {until_s} s")
                break
            self.clock.advance_to(t_s)
            fn()
        unfinished = [r for r, st in self.ranks.items() if st.pc < len(st.program)]
        if unfinished:
            self.violations.append(
                f"deadlock at t={self.clock.now():.6f}: ranks {unfinished} did not finish; "
                f"pending {self.core.pending()}")
        return SimResult(
            end_s=self.clock.now(),
            iteration_end_s={r: st.iter_end_s for r, st in self.ranks.items()},
            ack_wait_s=self.ack_wait_s,
            events=self.events,
            counters=dict(self.core.counters),
            violations=self.violations,
            reconfig_rails=self.reconfig_rails,
            driver=self.driver,
        )
