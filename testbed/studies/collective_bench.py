"""``opus-testbed bench alltoall`` and ``bench stragglar``: collective algorithms on circuits.

Both run one collective per iteration over every rank of one rail (:mod:`workloads.micro`),
two ports per rank (K = 2: a ring of three or more needs two circuits per rank), a rail rate
of 200 Gbit/s and 5 us per hop, on demand (no provisioning), one warm-up iteration and then the
measured ones (one for ``sim-ideal``, which has no jitter), on up to three backends: ``emu``
(Mininet and Open vSwitch, root, the calibrated link rate), ``sim-ideal`` (the modelled fabric
alone: :data:`IDEAL_COSTS`) and ``sim-emulator`` (the emulator's fixed costs:
:data:`EMULATOR_COSTS`, at the link rate the emulated run uses).

Port rate: as everywhere in the project, each of a rank's K ports runs at the full rail rate,
so a rank driving both of its ports (multihop) has twice the bandwidth of one using one port
at a time (matchings, the electrical rail). The JSON says so (``port_rate``) and the all-to-all
bench also gives the model's crossover if the K ports shared one NIC of the rail rate.

**bench alltoall.** The EP dispatch of Mixtral-8x7B (8192 tokens, top-2, bf16: 128 MiB per
rank, split evenly over the ranks), by ``matchings`` (N - 1 rounds of one-to-one circuits,
K rounds per switch), by ``multihop`` (forwarding over the lit ring, both directions) and on the
electrical rail (the pairwise exchange, no switching), at switching delays of 0.01, 1, 10 and
25 ms. Emulated at 8 ranks; simulated at 8, 32 and 256 (256 ranks on one rail exceed every
Table 3 radix except the robotic OCS's: the JSON says so). Time per all-to-all: from the last
member's intent to the last member's end (the median over the measured iterations). Emulated
points carry their run's fidelity verdict: the emulator's fixed costs (milliseconds per step,
connection and switching decision) and a busy machine hide sub-millisecond differences, which
only the IDEAL sim resolves; a crossover from degraded runs says so. The crossover
is the delay below which matchings beat multihop: a line through the matchings times against the
delay meets the multihop time.

**bench stragglar.** An all-reduce of 1 GiB over 8 ranks with a persistent straggler (the last
rank, late by each of several delays; Devraj et al., arXiv 2505.23523, who report 22 % (v1) and
25 % (v2) over the best baseline on an 8-GPU server): StragglAR against the ring, on electrical
rails and on circuits switching in 1 and 25 ms. ``after_arrival_s`` runs from the straggler's
intent to the last end (StragglAR's claim: its reduce-scatter is hidden in the delay),
``end_to_end_s`` from the first intent (medians over the measured iterations); speedup = ring /
StragglAR. The target is a speedup of at least 1.15 on electrical rails; a backend whose runs
were degraded (the fidelity guard) is not judged against it.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from testbed.backends import EMU, SIM, get_backend
from testbed.errors import RunRefused, Say, say_stderr
from testbed.experiment.config import ExperimentConfig
from testbed.experiment.prepare import prepare
from testbed.metrics.fidelity import calibrated_link_mbps
from testbed.results import store
from testbed.simulator.network import EMULATOR_COSTS, IDEAL_COSTS, network_model
from testbed.simulator.run import simulate_plan
from workloads.algorithms import (
    IdealRail,
    alltoall_model_s,
    matching_segments,
    stragglar_model_s,
    stragglar_rounds,
)
from workloads.config import Straggler
from workloads.hardware import Cluster
from workloads.micro import collective_schedule
from workloads.models import get_preset
from workloads.schedule import Schedule

RAIL_GBPS = 200.0
LATENCY_US = 5.0
PORTS_PER_RANK = 2
#: The fabric of the closed-form models the measured times are set against.
IDEAL_RAIL = IdealRail(RAIL_GBPS, LATENCY_US, PORTS_PER_RANK)
SIM_LINK_MBPS = 1000.0  # sets only the byte scale of the IDEAL runs
DELAYS_MS = (0.01, 1.0, 10.0, 25.0)
DELAY_LABELS = {0.01: "0.01 ms (RotorNet-class; Table 3 PLZT is 10 ns)"}
TABLE3_MAX_RADIX = 64  # ranks per rail beyond which only the robotic OCS of Table 3 fits
PORT_RATE = ("each of a rank's K ports runs at the full rail rate (network.rail_gbps), so "
             "multihop, which drives both ports at once, has twice the bandwidth of matchings")
STRAGGLAR_PAPER = ("Devraj et al., arXiv 2505.23523: 2x theoretical over Ring for large "
                   "clusters; 22 % (v1) / 25 % (v2) measured on an 8-GPU server")
PIPSWITCH = ("Ding & Singh, PipSwitch, arXiv 2501.18136: all-to-all as the N - 1 perfect "
             "matchings of a programmable-photonics OCS, up to 32 ports")
TARGET_SPEEDUP = 1.15
#: the bench's backends: each a backend of :mod:`testbed.backends` and, on the simulator, the
#: fixed costs it models (None: the emulator measures its own)
VARIANTS: dict[str, tuple[str, dict[str, float] | None]] = {
    "emu": (EMU, None), "sim-ideal": (SIM, IDEAL_COSTS), "sim-emulator": (SIM, EMULATOR_COSTS)}
BACKENDS = tuple(VARIANTS)

Point = dict[str, Any]


def mixtral_dispatch_bytes() -> int:
    """Bytes one rank dispatches per MoE layer: 8192 tokens x top-2 x hidden x bf16."""
    m = get_preset("mixtral-8x7b")
    return 8192 * m.top_k * m.hidden_size * 2


def _needs_root(variant: str) -> bool:
    return get_backend(VARIANTS[variant][0]).spec.needs_root


def default_backends() -> tuple[str, ...]:
    """Every backend as root; those that need no root (the simulated ones) otherwise."""
    return tuple(b for b in BACKENDS if os.geteuid() == 0 or not _needs_root(b))


# ------------------------------------------------------------------------------ running

class _Runner:
    """Runs one schedule on one backend and returns the measured calls."""

    def __init__(self, backends: Sequence[str], work_dir: Path | None, say: Say) -> None:
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise RunRefused(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
        rooted = [b for b in backends if _needs_root(b)]
        if rooted and os.geteuid() != 0:
            raise RunRefused(f"the {', '.join(rooted)} backend runs the emulator: it needs root "
                             f"(sudo), or leave it out (--backends {','.join(default_backends())})")
        self.backends = tuple(backends)
        self.work_dir = work_dir
        self.say = say
        self.runs = 0
        self.fidelity = "simulated"  # the last run's verdict ("ok", "degraded (machine)", ...)

    def calls(self, backend: str, sched: Schedule, *, mode: str, delay_ms: float,
              warmup: int, iterations: int, name: str) -> list[dict[str, Any]]:
        """The ``call`` records of the measured iterations (one for ``sim-ideal``: without
        jitter every iteration after the warm-up is the same)."""
        world = sched.world_size
        if backend == "sim-ideal":
            iterations = 1
        link = (SIM_LINK_MBPS if backend == "sim-ideal" else calibrated_link_mbps(world))
        cfg = ExperimentConfig(workload=sched.config, name=name, mode=mode,
                               switching_delay=delay_ms, ports_per_rank=PORTS_PER_RANK,
                               rail_gbps=RAIL_GBPS, link_mbps=link, latency_us=LATENCY_US,
                               iterations=iterations, warmup=warmup)
        self.runs += 1
        self.fidelity = "simulated"
        costs = VARIANTS[backend][1]
        if costs is None:
            records = self._emulate(cfg, sched)
        else:
            prep = prepare(cfg, check_capacity=False, schedule=sched)
            records, _events = simulate_plan(prep, seed=self.runs,
                                             network=network_model(link, LATENCY_US, costs))
        return [r for r in records if r.get("ev") == "call" and int(r["it"]) >= warmup]

    def _emulate(self, cfg: ExperimentConfig, sched: Schedule) -> list[dict[str, Any]]:
        emu = get_backend(VARIANTS["emu"][0])
        prep = prepare(cfg, schedule=sched)
        with tempfile.TemporaryDirectory(prefix="opus-bench-") as tmp:
            base = self.work_dir or Path(tmp)
            out = base / f"{cfg.name}-{self.runs}"
            self.say(f"  emulated: {cfg.name} ({cfg.mode}, {cfg.switching_delay_ms:g} ms)")
            summary = emu.run(cfg, out, lambda _m: None, prep)
            self.fidelity = str(summary.get("fidelity"))
            if summary.get("fidelity_blame") not in (None, "none"):
                self.fidelity += f" ({summary['fidelity_blame']})"
            return [r for f in sorted((out / "ranks").glob("rank*.jsonl"))
                    for r in store.read_jsonl(f)]


def per_collective(calls: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """Per (iteration, collective): the first and last intents, the last end, and each
    rank's intent."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for c in calls:
        groups[(int(c["it"]), str(c["cid"]))].append(c)
    out = []
    for _key, cs in sorted(groups.items()):
        intents = {int(c["rank"]): float(c["t_intent"]) for c in cs}
        out.append({"first": min(intents.values()), "last": max(intents.values()),
                    "end": max(float(c["t_end"]) for c in cs),
                    "segments": max(int(c.get("segments", 1)) for c in cs),
                    "delivered": all(int(c["received"]) == int(c["expected"]) for c in cs),
                    **{f"rank{r}": t for r, t in intents.items()}})
    return out


# ------------------------------------------------------------------------- all-to-all

def crossover_ms(points: Sequence[Point]) -> dict[str, Any]:
    """Where a line through the matchings times (against the delay) meets the mean multihop
    time: the switching delay below which matchings beat multihop."""
    m = sorted((p["switching_delay_ms"], p["time_per_a2a_s"]) for p in points
               if p["algorithm"] == "matchings")
    h = [p["time_per_a2a_s"] for p in points if p["algorithm"] == "multihop"]
    if len(m) < 2 or not h:
        return {"ms": None, "why": "needs matchings at two delays and multihop"}
    xs, ys = [x for x, _ in m], [y for _, y in m]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = (sum((x - mx) * (y - my) for x, y in m) / sum((x - mx) ** 2 for x in xs))
    level = statistics.mean(h)
    if slope <= 0:
        return {"ms": None, "why": "matchings do not slow down with the delay"}
    d = (level - (my - slope * mx)) / slope
    if d < 0:
        return {"ms": None, "why": "matchings are slower than multihop even without switching"}
    return {"ms": round(d, 4), "within_measured": xs[0] <= d <= xs[-1],
            "seconds_per_ms_of_delay": round(slope, 6)}


def run_alltoall_bench(*, ranks: Sequence[int] = (8, 32, 256), emu_ranks: int = 8,
                       size_mib: float | None = None, delays_ms: Sequence[float] = DELAYS_MS,
                       backends: Sequence[str] | None = None, iterations: int = 3,
                       plot: Path | None = Path("bench-alltoall.png"),
                       work_dir: Path | None = None, say: Say = say_stderr) -> dict[str, Any]:
    """The all-to-all bench (see the module docstring); JSON-able."""
    runner = _Runner(backends or default_backends(), work_dir, say)
    per_rank = int(size_mib * 2**20) if size_mib else mixtral_dispatch_bytes()
    points: list[Point] = []
    cases = [("electrical", "baseline", 0.0)] + [
        (a, "on-demand", d) for a in ("matchings", "multihop") for d in delays_ms]
    for backend in runner.backends:
        sizes = [emu_ranks] if backend != "sim-ideal" else list(ranks)
        for n in sizes:
            say(f"bench alltoall: {backend}, {n} ranks")
            for algorithm, mode, delay in cases:
                alg = "pairwise" if algorithm == "electrical" else algorithm
                sched = collective_schedule(Cluster(n, 1), "all_to_all", per_rank, gap_s=1e-3,
                                            algorithms=(("all_to_all", "", alg),))
                calls = runner.calls(backend, sched, mode=mode, delay_ms=delay, warmup=1,
                                     iterations=iterations, name=f"a2a-{algorithm}-{n}")
                spans = per_collective(calls)
                points.append({
                    "backend": backend, "ranks": n, "algorithm": algorithm,
                    "fabric": "electrical" if mode == "baseline" else "ocs",
                    "switching_delay_ms": delay,
                    "switching_delay_label": DELAY_LABELS.get(delay, f"{delay:g} ms"),
                    "time_per_a2a_s": statistics.median(s["end"] - s["last"] for s in spans),
                    "segments_per_a2a": spans[0]["segments"],
                    "model_s": round(alltoall_model_s(algorithm, n, per_rank, delay, IDEAL_RAIL),
                                     6),
                    "delivered": all(s["delivered"] for s in spans),
                    "fidelity": runner.fidelity,
                    "beyond_table3_radix": n > TABLE3_MAX_RADIX})
    crossovers: dict[str, dict[str, Any]] = defaultdict(dict)
    for backend in runner.backends:
        for n in sorted({p["ranks"] for p in points if p["backend"] == backend}):
            mine = [p for p in points if p["backend"] == backend and p["ranks"] == n]
            crossovers[str(n)][backend] = crossover_ms(mine)
            if any(p["fidelity"].startswith("degraded") for p in mine):
                crossovers[str(n)][backend]["fidelity"] = "degraded"
    for n in sorted({p["ranks"] for p in points}):
        for shared in (False, True):
            m0 = alltoall_model_s("matchings", n, per_rank, 0.0, IDEAL_RAIL)
            mh = alltoall_model_s("multihop", n, per_rank, 0.0, IDEAL_RAIL,
                                  shared_nic=shared)
            key = "model_shared_nic" if shared else "model"
            d = (mh - m0) / matching_segments(n, PORTS_PER_RANK) * 1e3
            crossovers[str(n)][key] = ({"ms": round(d, 4)} if d >= 0 else {
                "ms": None, "why": "matchings are slower than multihop even without switching"})
    out = {"bench": "alltoall", "model": "mixtral-8x7b", "per_rank_bytes": per_rank,
           "per_rank_source": "8192 tokens x top-2 x hidden 4096 x bf16 (EP dispatch)"
           if not size_mib else "--size-mib",
           "ports_per_rank": PORTS_PER_RANK, "rail_gbps": RAIL_GBPS, "latency_us": LATENCY_US,
           "port_rate": PORT_RATE, "reference": PIPSWITCH,
           "radix_note": f"more than {TABLE3_MAX_RADIX} ranks on one rail exceed every Table 3 "
                         "radix except the robotic OCS's",
           "backends": list(runner.backends), "points": points, "crossover_ms": crossovers}
    if plot is not None:
        from testbed.results.plots import alltoall_plot

        alltoall_plot(points, plot, {int(n): c["sim-ideal"]["ms"] for n, c in crossovers.items()
                                     if c.get("sim-ideal", {}).get("ms") is not None})
        out["plot"] = str(plot)
    return out


# ------------------------------------------------------------------------- stragglar

def run_stragglar_bench(*, ranks: int = 8, size_mib: float = 1024.0,
                        straggler_delays_ms: Sequence[float] = (0, 10, 20, 50, 100),
                        switching_delays_ms: Sequence[float] = (1.0, 25.0),
                        backends: Sequence[str] | None = None, iterations: int = 3,
                        plot: Path | None = Path("bench-stragglar.png"),
                        work_dir: Path | None = None, say: Say = say_stderr) -> dict[str, Any]:
    """The StragglAR bench (see the module docstring); JSON-able."""
    runner = _Runner(backends or default_backends(), work_dir, say)
    size = int(size_mib * 2**20)
    straggler = ranks - 1
    fabrics: list[tuple[str, str, float | None]] = [("electrical", "baseline", None)] + [
        (f"ocs {d:g} ms", "on-demand", d) for d in switching_delays_ms]
    points: list[Point] = []
    for backend in runner.backends:
        say(f"bench stragglar: {backend}")
        for fabric, mode, delay in fabrics:
            for late_ms in straggler_delays_ms:
                for algorithm in ("ring", "stragglar"):
                    sched = collective_schedule(
                        Cluster(ranks, 1), "all_reduce", size, gap_s=1e-3,
                        algorithms=(("all_reduce", "", algorithm),),
                        stragglers=(Straggler(straggler, late_ms / 1e3),))
                    calls = runner.calls(backend, sched, mode=mode, delay_ms=delay or 0.0,
                                         warmup=1, iterations=iterations,
                                         name=f"ar-{algorithm}-{late_ms:g}")
                    spans = per_collective(calls)
                    points.append({
                        "backend": backend, "fabric": fabric, "switching_delay_ms": delay,
                        "algorithm": algorithm, "straggler_delay_ms": late_ms,
                        "after_arrival_s": statistics.median(
                            s["end"] - s[f"rank{straggler}"] for s in spans),
                        "end_to_end_s": statistics.median(s["end"] - s["first"] for s in spans),
                        "segments": spans[0]["segments"],
                        "model_after_arrival_s": round(stragglar_model_s(
                            algorithm, ranks, size, late_ms, delay, IDEAL_RAIL), 6),
                        "delivered": all(s["delivered"] for s in spans),
                        "fidelity": runner.fidelity})
    speedups = _speedups(points)
    best = {b: max((s["after_arrival"] for s in speedups
                    if s["backend"] == b and s["fabric"] == "electrical"), default=None)
            for b in runner.backends}
    degraded = sorted({p["backend"] for p in points if p["fidelity"].startswith("degraded")})
    out = {"bench": "stragglar", "ranks": ranks, "straggler_rank": straggler,
           "size_bytes": size, "ports_per_rank": PORTS_PER_RANK, "rail_gbps": RAIL_GBPS,
           "latency_us": LATENCY_US, "port_rate": PORT_RATE, "reference": STRAGGLAR_PAPER,
           "post_rounds": len(stragglar_rounds(ranks)), "backends": list(runner.backends),
           "points": points, "speedups": speedups,
           "target": {"speedup_over_ring_on_electrical_rails": TARGET_SPEEDUP,
                      "paper": "22 % (v1) / 25 % (v2) on 8 GPUs",
                      "best_electrical_after_arrival": best,
                      "target_met": {b: None if b in degraded else (
                          v is not None and v >= TARGET_SPEEDUP) for b, v in best.items()},
                      "not_judged": {b: "its runs were degraded (fidelity): the machine could "
                                     "not keep the emulated timing" for b in degraded}}}
    if plot is not None:
        from testbed.results.plots import stragglar_plot

        stragglar_plot(points, plot)
        out["plot"] = str(plot)
    return out


def _speedups(points: Sequence[Point]) -> list[dict[str, Any]]:
    """Ring over StragglAR per backend, fabric and straggler delay, for both spans."""
    key: Callable[[Point], tuple[str, str, float]] = lambda p: (  # noqa: E731
        p["backend"], p["fabric"], p["straggler_delay_ms"])
    ring = {key(p): p for p in points if p["algorithm"] == "ring"}
    out = []
    for p in points:
        r = ring.get(key(p))
        if p["algorithm"] != "stragglar" or r is None:
            continue
        out.append({"backend": p["backend"], "fabric": p["fabric"],
                    "switching_delay_ms": p["switching_delay_ms"],
                    "straggler_delay_ms": p["straggler_delay_ms"],
                    "after_arrival": _ratio(r["after_arrival_s"], p["after_arrival_s"]),
                    "end_to_end": _ratio(r["end_to_end_s"], p["end_to_end_s"]),
                    "model_after_arrival": _ratio(r["model_after_arrival_s"],
                                                  p["model_after_arrival_s"])})
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 and not math.isnan(a / b) else None
