"""Randomised inputs for the Opus core, for its golden traces (``core_trace.py``).

:func:`drive` plays a seeded, reactive world against a core: ranks of two jobs ask for random
groups (several open calls per rank, as lanes do), complete acknowledged calls with right,
wrong and bad predictions of their next call, the driver lights decisions out of order or
fails them, ranks get lost and come back, a job is unregistered and registered again, and now
and then an input is bad (unknown job, rank or group, stale or duplicate call, completion of a
call never acknowledged). Ports are scarce (one or two per rank and rail), so calls queue deep,
wait on protected and dark ports and block one another first-come-first-served.

The world reacts to what the core answers (acks let ranks complete, rejects give the call's
sequence number back as the shim does, decisions go to the driver), so a core that answers
differently would also be fed differently: the recorded inputs pin the core that recorded them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from controller.core import CoreConfig, Intent, OpusCore, Output
from controller.job import CommGroup, JobError, JobSpec, RankPorts
from controller.ocs import ApplyResult, Circuit, RailDescription

_AXES = ("dp", "pp", "tp", "")


@dataclass(frozen=True)
class WorldShape:
    """The size of a random world and how busy its ranks are."""

    ranks: tuple[int, int] = (12, 6)  # ranks of job a, job b
    groups: tuple[int, int] = (14, 6)
    ports_per_rank: int = 1
    optical_rails: int = 2
    electrical_rail: bool = True
    steps: int = 2500
    ask_weight: float = 0.36  # share of steps that are intents (then completions, lights, ...)
    fail_rate: float = 0.08  # share of decisions the driver fails


@dataclass
class _Call:
    job_id: str
    rank: int
    group_id: str
    seq: int


@dataclass
class _World:
    rng: random.Random
    jobs: dict[str, JobSpec]
    registered: set[str] = field(default_factory=set)
    seqs: dict[tuple[str, int, str], int] = field(default_factory=dict)
    acked: list[_Call] = field(default_factory=list)
    inflight: list[Any] = field(default_factory=list)  # Decision
    lost: set[tuple[str, int]] = field(default_factory=set)
    predicted: dict[tuple[str, int], str] = field(default_factory=dict)
    to_ask: list[tuple[str, int, str]] = field(default_factory=list)  # members yet to ask
    done: list[_Call] = field(default_factory=list)  # the last completions reported
    now: float = 0.0


def rails_and_jobs(rng: random.Random, shape: WorldShape
                   ) -> tuple[list[RailDescription], list[Circuit], dict[str, JobSpec]]:
    """Rails (with spare unowned ports), random initial circuits, and two jobs of random groups."""
    n_rails = shape.optical_rails + (1 if shape.electrical_rail else 0)
    k = shape.ports_per_rank
    ports: dict[int, list[int]] = {rail: [] for rail in range(n_rails)}
    jobs: dict[str, JobSpec] = {}
    next_port = {rail: 1 for rail in range(n_rails)}
    for job_id, n_ranks, n_groups in zip("ab", shape.ranks, shape.groups, strict=True):
        ranks = {}
        for r in range(n_ranks):
            rail = r % n_rails
            block = tuple(range(next_port[rail], next_port[rail] + k))
            next_port[rail] += k
            ports[rail].extend(block)
            ranks[r] = RankPorts(r, rail, block)
        groups: dict[str, CommGroup] = {}
        while len(groups) < n_groups:
            size = rng.choice((2, 2, 2, 3, 4))
            pool = list(range(n_ranks))
            if rng.random() < 0.8:  # mostly on one rail, as rail-optimized groups are
                rail = rng.randrange(shape.optical_rails)
                pool = [r for r in pool if r % n_rails == rail]
            members = tuple(rng.sample(pool, min(size, len(pool))))
            kind = rng.choice(("ring", "ring", "pairs"))
            grp = CommGroup(f"{job_id}{len(groups)}", rng.choice(_AXES), members, kind)
            try:
                JobSpec(job_id, ranks, {**groups, grp.group_id: grp})
            except JobError:
                continue  # needs more ports than a rank has: draw another
            groups[grp.group_id] = grp
        jobs[job_id] = JobSpec(job_id, ranks, groups)
    rails = []
    circuits = []
    for rail, ps in ports.items():
        spare = [900 + rail * 10 + i for i in range(3)]
        mode = "electrical" if shape.electrical_rail and rail == n_rails - 1 else "ocs"
        rails.append(RailDescription(rail, tuple(ps + spare), 10.0, mode))
        if mode == "ocs":
            free = ps + spare
            rng.shuffle(free)
            for i in range(0, min(len(free) - 1, 6), 2):
                circuits.append(Circuit(rail, free[i], free[i + 1]))
    return rails, circuits, jobs


def drive(make_core: Any, seed: int, mode: str, shape: WorldShape | None = None) -> OpusCore:
    """Run a random world of ``seed`` against ``make_core(rails, config, circuits)``."""
    shape = shape or WorldShape()
    rng = random.Random(seed)
    rails, circuits, jobs = rails_and_jobs(rng, shape)
    core: OpusCore = make_core(rails, CoreConfig.for_mode(mode), circuits)
    world = _World(rng, jobs)
    for job in jobs.values():
        _take(world, core.register_job(job, world.now))
        world.registered.add(job.job_id)
    for _ in range(shape.steps):
        world.now += rng.random() * 1e-3
        x = rng.random()
        if len(world.registered) < len(jobs) and x < 0.05:
            _reregister(world, core)  # an unregistered job comes back soon
        elif x < shape.ask_weight:
            _ask(world, core)
        elif x < shape.ask_weight + 0.3:
            _complete(world, core, mode == "provisioning")
        elif x < 0.96:
            _light(world, core, shape.fail_rate)
        elif x < 0.97:
            _lose_or_rejoin(world, core)
        elif x < 0.971:
            _reregister(world, core)
        else:
            _bad_input(world, core)
    while world.inflight:  # the driver finishes what it started
        _light(world, core, shape.fail_rate)
    return core


def _take(world: _World, out: Output) -> None:
    """React to the core's answers as the shims and the driver would."""
    for ack in out.acks:
        if isinstance(ack.ref, tuple) and ack.ref[0] in ("ask", "again"):
            world.acked.append(_Call(ack.job_id, ack.rank, ack.group_id, ack.seq))
    for rej in out.rejects:
        if isinstance(rej.ref, tuple) and rej.ref[0] == "ask":
            _, job_id, rank, group_id, seq = rej.ref
            key = (job_id, rank, group_id)
            if world.seqs.get(key) == seq + 1:
                world.seqs[key] = seq  # the call did not happen: the shim numbers it again
    world.inflight.extend(out.decisions)


def _ask(world: _World, core: OpusCore) -> None:
    """A rank asks: one that a call of its group waits for, or a member of a new call."""
    rng = world.rng
    if world.to_ask and rng.random() < 0.6:
        job_id, rank, group_id = world.to_ask.pop(rng.randrange(len(world.to_ask)))
    else:
        job_id = rng.choice(sorted(world.registered)) if world.registered else "a"
        job = world.jobs[job_id]
        rank = rng.choice(sorted(job.ranks))
        mine = sorted(g for g, grp in job.groups.items() if rank in grp.ranks)
        if not mine:
            return
        group_id = world.predicted.pop((job_id, rank), None)
        if group_id is None or rng.random() < 0.3:
            group_id = rng.choice(mine)
        # the other members follow (most of them: a few never come, the call then waits)
        world.to_ask.extend((job_id, r, group_id) for r in job.groups[group_id].ranks
                            if r != rank and rng.random() < 0.9)
    if (job_id, rank) in world.lost or job_id not in world.jobs:
        return
    job = world.jobs[job_id]
    key = (job_id, rank, group_id)
    seq = world.seqs.get(key, 0)
    world.seqs[key] = seq + 1
    intent = Intent(job_id, rank, group_id, seq, rng.choice(("allreduce", "allgather")),
                    rng.choice((1, 1024, 1 << 20)), job.groups[group_id].axis)
    _take(world, core.intent(intent, world.now, ref=("ask", job_id, rank, group_id, seq)))


def _complete(world: _World, core: OpusCore, provisioning: bool) -> None:
    rng = world.rng
    if not world.acked:
        return
    call = world.acked.pop(rng.randrange(len(world.acked)))
    nxt = None
    job = world.jobs[call.job_id]
    if provisioning and rng.random() < 0.8:
        mine = sorted(g for g, grp in job.groups.items() if call.rank in grp.ranks)
        group_id = rng.choice(mine)
        seq = world.seqs.get((call.job_id, call.rank, group_id), 0)
        x = rng.random()
        if x < 0.1:
            seq = max(0, seq - 2)  # stale: a call already done
        elif x < 0.15:
            group_id = rng.choice(sorted(job.groups))  # maybe not the rank's group at all
        elif x < 0.75:
            world.predicted[(call.job_id, call.rank)] = group_id  # the rank will ask it
        nxt = Intent(call.job_id, call.rank, group_id, seq, "allreduce", 1,
                     job.groups[group_id].axis)
    world.done = [*world.done[-20:], call]
    _take(world, core.complete(call.job_id, call.rank, call.group_id, call.seq, world.now,
                               ref=("done", call.rank), next_intent=nxt))


def _light(world: _World, core: OpusCore, fail_rate: float) -> None:
    rng = world.rng
    if not world.inflight:
        return
    d = world.inflight.pop(rng.randrange(len(world.inflight)))
    if rng.random() < fail_rate:
        _take(world, core.reconfig_failed(d.decision_id, "random failure", world.now))
        return
    t = world.now
    res = [ApplyResult(rc.rail, rc.add, rc.remove, t - 2e-4, t - 1e-4, t) for rc in d.reconfs]
    _take(world, core.reconfig_done(d.decision_id, res, world.now))


def _lose_or_rejoin(world: _World, core: OpusCore) -> None:
    rng = world.rng
    if world.lost and rng.random() < 0.7:
        job_id, rank = sorted(world.lost)[rng.randrange(len(world.lost))]
        world.lost.discard((job_id, rank))
        _take(world, core.rank_rejoined(job_id, rank, world.now))
        return
    job_id = rng.choice("ab")
    rank = rng.choice(sorted(world.jobs[job_id].ranks))
    if world.inflight and rng.random() < 0.5:  # a member of a call being switched
        d = world.inflight[rng.randrange(len(world.inflight))]
        if d.job_id in world.jobs:
            job_id = d.job_id
            rank = rng.choice(world.jobs[job_id].groups[d.group_id].ranks)
    world.lost.add((job_id, rank))
    world.acked = [c for c in world.acked if (c.job_id, c.rank) != (job_id, rank)]
    _take(world, core.rank_lost(job_id, rank, world.now))


def _reregister(world: _World, core: OpusCore) -> None:
    job_id = world.rng.choice("ab")
    if job_id in world.registered:
        world.registered.discard(job_id)
        world.acked = [c for c in world.acked if c.job_id != job_id]
        world.to_ask = [a for a in world.to_ask if a[0] != job_id]
        world.lost = {x for x in world.lost if x[0] != job_id}
        world.seqs = {k: v for k, v in world.seqs.items() if k[0] != job_id}
        _take(world, core.unregister_job(job_id, world.now))
    else:
        world.registered.add(job_id)
        _take(world, core.register_job(world.jobs[job_id], world.now))


def _bad_input(world: _World, core: OpusCore) -> None:
    """An input a buggy or late shim might send; the core must refuse it and go on."""
    rng = world.rng
    x = rng.randrange(8)
    job = world.jobs["a"]
    if x == 0:
        out = core.intent(Intent("nojob", 0, "a0", 0), world.now, ref="bad")
    elif x == 1:
        out = core.intent(Intent("a", 999, "a0", 0), world.now, ref="bad")
    elif x == 2:
        out = core.intent(Intent("a", 0, "nogroup", 0), world.now, ref="bad")
    elif x == 3:  # a rank asks again for a call it has asked (or done) already
        keys = sorted(k for k in world.seqs if k[0] == "a" and world.seqs[k] > 0)
        if not keys:
            return
        _, rank, group_id = keys[rng.randrange(len(keys))]
        seq = world.seqs[("a", rank, group_id)] - 1
        out = core.intent(Intent("a", rank, group_id, seq, "", 0, job.groups[group_id].axis),
                          world.now, ref=("again", "a", rank, group_id, seq))
    elif x == 4:
        out = core.complete("a", rng.choice(sorted(job.ranks)), "a0", 10_000, world.now,
                            ref="bad")
    elif x == 5:  # a rank that is not a member of the group
        grp = job.groups["a0"]
        others = sorted(set(job.ranks) - set(grp.ranks))
        out = core.intent(Intent("a", others[0], "a0", 0), world.now, ref="bad")
    elif x == 6:  # a completion reported twice
        if not world.done:
            return
        call = world.done[rng.randrange(len(world.done))]
        out = core.complete(call.job_id, call.rank, call.group_id, call.seq, world.now,
                            ref="bad")
    else:
        out = core.reconfig_done(10_000 + rng.randrange(10), [], world.now)
    _take(world, out)
