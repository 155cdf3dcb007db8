"""Benchmarks of the controller (``opus-testbed bench intents --json``).

* ``ack_ms``: intent -> ack latency through the real service over loopback TCP when the circuits
  are already lit (no reconfiguration): two shims (two threads of a child process) call a
  two-rank group; a call is served once both asked, so the later ask of each call measures the
  controller's response;
* ``core_intents_per_s``: decision throughput of the pure core for a 1024-rank job (8 GPUs per
  server, 8 rails, 2 ports per rank and rail) alternating DP rings and PP pairs, switching
  circuits at the first call of every phase (4 calls per phase, as per-layer collectives); the
  driver is replaced by immediate light. Best of 3 runs (the machine is shared);
* ``queue``: the cost of the core's operations beside a queue of waiting calls, at two depths
  (:func:`bench_queue`): equal figures at 100 and 10 000 calls mean completion, first-come-
  first-served admission and the provisioning lookups do not grow with the queue.
"""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

from controller.core import CoreConfig, Intent, OpusCore, Output
from controller.drivers.sim import SimOcsDriver
from controller.job import CommGroup, JobSpec
from controller.ocs import ApplyResult, Circuit, Reconfiguration
from controller.service import ControllerService
from controller.shim import Shim
from controller.stats import percentiles


def _ack_client(endpoint: str, job_id: str, n_calls: int, conn: Any) -> None:
    """Child process: two shims in two threads call a two-rank group ``n_calls`` times."""
    waits: dict[int, list[float]] = {0: [], 1: []}

    def rank_loop(shim: Shim, rank: int) -> None:
        for _ in range(n_calls):
            with shim.collective("g", "allreduce", 1024) as grant:
                waits[rank].append(grant.wait_s * 1e3)

    with Shim(endpoint, job_id, 0) as a, Shim(endpoint, job_id, 1) as b:
        other = threading.Thread(target=rank_loop, args=(b, 1))
        other.start()
        rank_loop(a, 0)
        other.join()
    conn.send(waits)
    conn.close()


def bench_ack_latency(n_calls: int = 2000, warmup: int = 50) -> dict[str, float]:
    """p50/p99 of intent -> ack over loopback with the circuits already lit (ms).

    The shims run in a child process (as ranks do), the service in this one.
    """
    job = JobSpec.rail_optimized("bench-ack", 2, 1, 1, [CommGroup("g", "dp", (0, 1))])
    driver = SimOcsDriver(job.ports_by_rail, 0.0)
    driver.begin([Reconfiguration.of(0, add=[(1, 2)])])
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    with ControllerService(driver) as svc:
        svc.register_job(job)
        proc = ctx.Process(target=_ack_client,
                           args=(svc.endpoint, job.job_id, n_calls + warmup, child))
        proc.start()
        try:
            if not parent.poll(120):
                raise TimeoutError("ack benchmark client did not finish in 120 s")
            waits = parent.recv()
        finally:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    # a call is served once both ranks asked: the later ask sees the controller's response
    lat_ms = [min(w0, w1) for w0, w1 in zip(waits[0][warmup:], waits[1][warmup:], strict=True)]
    p50, p99 = percentiles(lat_ms, (50, 99))
    return {"p50": p50, "p99": p99,
            "mean": statistics.fmean(lat_ms), "n": float(len(lat_ms))}


def bench_job(n_ranks: int = 1024, gpus_per_server: int = 8, ring_servers: int = 8,
              ports_per_rank: int = 2) -> JobSpec:
    """DP rings of ``ring_servers`` servers per rail, PP pairs across the two halves."""
    n_servers = n_ranks // gpus_per_server
    groups = []
    for local in range(gpus_per_server):
        for start in range(0, n_servers, ring_servers):
            ranks = tuple((start + i) * gpus_per_server + local for i in range(ring_servers))
            groups.append(CommGroup(f"dp-{local}-{start}", "dp", ranks))
        half = n_servers // 2
        for s in range(half):
            a, b = s * gpus_per_server + local, (s + half) * gpus_per_server + local
            groups.append(CommGroup(f"pp-{local}-{s}", "pp", (a, b), "pairs"))
    return JobSpec.rail_optimized("bench-core", n_ranks, gpus_per_server, ports_per_rank, groups)


def bench_core(iterations: int = 4, calls_per_phase: int = 4,
               config: CoreConfig | None = None) -> dict[str, float]:
    """Intents per second of the pure core for a 1024-rank job (plan, switch, ack, complete).

    Each phase issues ``calls_per_phase`` calls per group (per-layer collectives, as FSDP does);
    the first call of a phase switches the circuits, the others find them lit.
    """
    job = bench_job()
    from controller.ocs import RailDescription

    rails = [RailDescription(rail, tuple(sorted(ps)), 10.0)
             for rail, ps in sorted(job.ports_by_rail.items())]
    core = OpusCore(rails, config or CoreConfig())
    core.register_job(job, 0.0)
    phases = [[g for g in job.groups.values() if g.axis == axis] for axis in ("dp", "pp")]
    seqs: dict[str, int] = {}
    n_intents = 0
    now = 0.0
    t0 = time.perf_counter()
    rounds = [groups for _ in range(iterations) for groups in phases
              for _call in range(calls_per_phase)]
    for groups in rounds:
        pending: list[Output] = []
        calls = []
        for g in groups:
            seq = seqs.get(g.group_id, 0)
            seqs[g.group_id] = seq + 1
            calls.append((g, seq))
            for r in g.ranks:
                now += 1e-6
                pending.append(core.intent(Intent(job.job_id, r, g.group_id, seq, "x", 1), now))
                n_intents += 1
        while pending:
            out = pending.pop()
            for d in out.decisions:
                res = [_lit(rc, now) for rc in d.reconfs]
                pending.append(core.reconfig_done(d.decision_id, res, now))
        for g, seq in calls:
            for r in g.ranks:
                now += 1e-6
                core.complete(job.job_id, r, g.group_id, seq, now)
    dt = time.perf_counter() - t0
    return {"intents": float(n_intents), "seconds": dt, "intents_per_s": n_intents / dt,
            "decisions": float(core.counters["decisions"]), "acks": float(core.counters["acks"])}


def _light_all(core: OpusCore, out: Output, now: float) -> None:
    """Light every decision of ``out`` at once (and of the outputs lighting them produces)."""
    pending = [out]
    while pending:
        for d in pending.pop().decisions:
            pending.append(core.reconfig_done(d.decision_id, [_lit(rc, now) for rc in d.reconfs],
                                              now))


def bench_queue(depth: int, rounds: int = 500) -> dict[str, float]:
    """Microseconds per core operation while ``depth`` calls wait in the queue.

    One rail, one port per rank. Blocker pairs ``(2i+1, 2i+2)`` are lit and running (their
    circuits protected); waiting pairs ``(2i, 2i+1)`` then ask (rank 2i+1 finished its part of
    the blocker), so each needs a port a running call holds: ``depth`` calls queue. Beside
    them a probe pair, lit, runs ``rounds`` calls with provisioning: two intents (admitted
    first-come-first-served: no older queued call shares its ranks, so it is acked at once)
    and two completions, each carrying the rank's predicted next call (a speculative ask).
    Then every blocker finishes and the waiting calls are switched and lit (``served_us``: per
    waiting call, completions and decisions included).
    """
    n_pairs = depth + 1
    probe = (2 * n_pairs + 1, 2 * n_pairs + 2)
    groups = [CommGroup(f"b{i}", "dp", (2 * i + 1, 2 * i + 2), "pairs") for i in range(depth)]
    groups += [CommGroup(f"w{i}", "pp", (2 * i, 2 * i + 1), "pairs") for i in range(depth)]
    groups.append(CommGroup("probe", "pp", probe, "pairs"))
    job = JobSpec.rail_optimized("bench-queue", probe[1] + 1, 1, 1, groups)
    from controller.ocs import RailDescription

    rails = [RailDescription(rail, tuple(sorted(ps)), 10.0)
             for rail, ps in sorted(job.ports_by_rail.items())]
    core = OpusCore(rails, CoreConfig(provisioning=True))
    jid = job.job_id
    core.register_job(job, 0.0)
    now = 0.0
    for gid in [f"b{i}" for i in range(depth)] + ["probe"]:
        for r in job.groups[gid].ranks:
            _light_all(core, core.intent(Intent(jid, r, gid, 0), now), now)
    for r in probe:
        core.complete(jid, r, "probe", 0, now)
    for i in range(depth):
        core.complete(jid, 2 * i + 1, f"b{i}", 0, now)
        for r in (2 * i, 2 * i + 1):
            _light_all(core, core.intent(Intent(jid, r, f"w{i}", 0), now), now)
    queued = sum(1 for p in core.pending() if p[3] == "queued")
    if queued != depth:
        raise RuntimeError(f"queue benchmark: {queued} calls queued, expected {depth}")
    t0 = time.perf_counter()
    for seq in range(1, rounds + 1):
        for r in probe:
            core.intent(Intent(jid, r, "probe", seq), now)
    t_intents = time.perf_counter() - t0
    t0 = time.perf_counter()
    for seq in range(1, rounds + 1):
        for r in probe:
            _light_all(core, core.complete(jid, r, "probe", seq, now,
                                           next_intent=Intent(jid, r, "probe", seq + 1)), now)
    t_completes = time.perf_counter() - t0
    acks = core.counters["acks"]
    t0 = time.perf_counter()
    for i in range(depth):
        _light_all(core, core.complete(jid, 2 * i + 2, f"b{i}", 0, now), now)
    t_served = time.perf_counter() - t0
    served = core.counters["acks"] - acks
    if served != 2 * depth:
        raise RuntimeError(f"queue benchmark: {served} acks after the drain, expected {2 * depth}")
    return {"depth": float(depth), "intent_us": t_intents / (2 * rounds) * 1e6,
            "complete_us": t_completes / (2 * rounds) * 1e6,
            "served_us": t_served / depth * 1e6 if depth else 0.0}


def _lit(rc: Reconfiguration, now: float) -> ApplyResult:
    added: frozenset[Circuit] = rc.add
    return ApplyResult(rc.rail, added, rc.remove, now, now, now)


QUEUE_DEPTHS = (100, 10_000)


def run_intents_bench(n_calls: int = 2000, iterations: int = 4, repeats: int = 3,
                      queue_depths: Sequence[int] = QUEUE_DEPTHS) -> dict[str, Any]:
    """The figures of ``opus-testbed bench intents --json`` (core: best of ``repeats`` runs;
    queue rows: one run per depth)."""
    ack = bench_ack_latency(n_calls)
    core = max((bench_core(iterations) for _ in range(repeats)),
               key=lambda r: r["intents_per_s"])
    queue = [bench_queue(depth) for depth in queue_depths]
    return {
        "ack_ms": {"p50": round(ack["p50"], 4), "p99": round(ack["p99"], 4)},
        "core_intents_per_s": round(core["intents_per_s"]),
        "queue": [{"depth": int(q["depth"]), "intent_us": round(q["intent_us"], 2),
                   "complete_us": round(q["complete_us"], 2),
                   "served_us": round(q["served_us"], 2)} for q in queue],
        "detail": {"ack_samples": int(ack["n"]), "ack_mean_ms": round(ack["mean"], 4),
                   "core_intents": int(core["intents"]), "core_decisions": int(core["decisions"]),
                   "core_acks": int(core["acks"]), "core_ranks": 1024},
    }


if __name__ == "__main__":  # pragma: no cover
    import json

    print(json.dumps(run_intents_bench()))
