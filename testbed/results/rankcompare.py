"""Per-rank timing of two emulated runs side by side (``opus-testbed bench ranks A B``).

Made to compare one process per rank against one per server (``run.ranks_per_process``) on the
same config, but any two finished emulated result directories of the same cluster compare. Per
rank and run, from ``ranks/rank<R>.jsonl`` (times in seconds after the run's launch of its rank
processes, ``ranks/launch.json``; without it, after the earliest ``started`` record):

* ``started_s``: the rank's ``started`` record (its interpreter loaded, its lanes running);
* ``first_call_s``: the first call's intent; ``last_end_s``: the last iteration's end;
* ``iteration_s``: every iteration's duration, in order;
* ``compute_overshoot_ms``: how much longer than planned its compute phases took (p50, p90,
  max; iterations after the first), from the rank's plan (``ranks/rank<R>.plan.json``). A
  compute phase is a timed wait, so this is how late the rank's thread got the CPU (and, with
  several ranks in one process, the GIL) back.

The comparison gives each rank's figures in both runs and ``b - a``, and per run the spread
across ranks (latest minus earliest start, first call, last end). Pure but for reading files.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from controller.stats import percentiles
from testbed.plan.rankplan import plan_record


def _quantiles_ms(values_s: list[float]) -> dict[str, float] | None:
    """p50, p90 (:func:`controller.stats.percentile`), max and count, in ms; None for none."""
    if not values_s:
        return None
    ms = [v * 1e3 for v in values_s]
    p50, p90 = percentiles(ms, (50, 90))
    return {"p50": p50, "p90": p90, "max": max(ms), "n": len(ms)}


def compute_overshoots_s(records: Iterable[dict[str, Any]], durations_s: dict[int, float]
                         ) -> list[float]:
    """How much longer than planned each compute phase after the first iteration took."""
    return [float(rec["t_end"]) - float(rec["t_start"]) - durations_s[int(rec["i"])]
            for rec in records if rec.get("ev") == "compute" and int(rec["it"]) >= 1
            and int(rec["i"]) in durations_s]


def rank_timing(records: list[dict[str, Any]], t0: float,
                durations_s: dict[int, float] | None = None) -> dict[str, Any]:
    """One rank's figures (see the module docstring) from its records; ``t0``: time zero;
    ``durations_s``: its compute ops' planned durations by op index (None: unknown)."""
    started: float | None = None
    first_call: float | None = None
    iterations: dict[int, tuple[float, float]] = {}
    for rec in records:
        ev = rec.get("ev")
        if ev == "started" and started is None:
            started = float(rec["t"])
        elif ev == "call":
            t = float(rec["t_intent"])
            first_call = t if first_call is None else min(first_call, t)
        elif ev == "iteration":
            iterations[int(rec["it"])] = (float(rec["t_start"]), float(rec["t_end"]))
    ends = [end for _start, end in iterations.values()]
    return {"started_s": None if started is None else started - t0,
            "first_call_s": None if first_call is None else first_call - t0,
            "last_end_s": max(ends) - t0 if ends else None,
            "iteration_s": [iterations[it][1] - iterations[it][0] for it in sorted(iterations)],
            "compute_overshoot_ms": None if durations_s is None else _quantiles_ms(
                compute_overshoots_s(records, durations_s))}


def _spread(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) - min(known) if known else None


def run_timing(ranks: dict[int, list[dict[str, Any]]], t_launch: float | None,
               durations_s: dict[int, dict[int, float]] | None = None) -> dict[str, Any]:
    """Every rank's figures and their spread across ranks; time zero is ``t_launch`` (else the
    earliest ``started`` record); ``durations_s``: per rank, its compute ops' durations. The
    compute overshoot is also given over every rank's phases together."""
    starts = [float(r["t"]) for recs in ranks.values() for r in recs if r.get("ev") == "started"]
    t0 = t_launch if t_launch is not None else min(starts, default=0.0)
    durations_s = durations_s or {}
    per_rank = {rank: rank_timing(recs, t0, durations_s.get(rank))
                for rank, recs in sorted(ranks.items())}
    overshoots = [v for rank, recs in ranks.items() if rank in durations_s
                  for v in compute_overshoots_s(recs, durations_s[rank])]
    return {"ranks": per_rank, "compute_overshoot_ms": _quantiles_ms(overshoots),
            "spread_s": {key: _spread([v[key] for v in per_rank.values()])
                         for key in ("started_s", "first_call_s", "last_end_s")}}


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two :func:`run_timing` results rank by rank: each rank's figures in both and ``b - a``
    (iteration by iteration for the iterations both have), with medians over ranks."""
    rows = []
    for rank in sorted(set(a["ranks"]) & set(b["ranks"])):
        ra, rb = a["ranks"][rank], b["ranks"][rank]
        diff: dict[str, Any] = {key: _diff(ra[key], rb[key])
                                for key in ("started_s", "first_call_s", "last_end_s")}
        diff["iteration_s"] = [y - x for x, y in zip(ra["iteration_s"], rb["iteration_s"],
                                                     strict=False)]
        rows.append({"rank": rank, "a": ra, "b": rb, "b_minus_a": diff})
    median: dict[str, float | None] = {}
    for key in ("started_s", "first_call_s", "last_end_s"):
        known = [r["b_minus_a"][key] for r in rows if r["b_minus_a"][key] is not None]
        median[key] = statistics.median(known) if known else None
    return {"ranks": rows, "median_b_minus_a_s": median,
            "only_in_a": sorted(set(a["ranks"]) - set(b["ranks"])),
            "only_in_b": sorted(set(b["ranks"]) - set(a["ranks"]))}


def load_run(out: Path) -> dict[str, Any]:
    """:func:`run_timing` of the emulated run in ``out``, with what its manifest and launch
    record say of its processes."""
    ranks: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((out / "ranks").glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        ranks[rank] = [json.loads(line) for line in path.read_text().splitlines() if line]
    if not ranks:
        raise FileNotFoundError(f"{out}: no ranks/rank*.jsonl (not an emulated run's results)")
    launch_path = out / "ranks" / "launch.json"
    launch = json.loads(launch_path.read_text()) if launch_path.exists() else {}
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    durations: dict[int, dict[int, float]] = {}
    for rank in ranks:
        plan_path = out / "ranks" / f"rank{rank}.plan.json"
        plan = (plan_record(json.loads(plan_path.read_text()), str(plan_path))
                if plan_path.exists() else None)
        if plan is not None:
            durations[rank] = {op.index: op.duration_s for op in plan.ops if not op.is_call}
    timing = run_timing(ranks, launch.get("t_start"), durations)
    return {"dir": str(out), "rank_processes": manifest.get("rank_processes", "rank"),
            "processes": launch.get("processes"),
            "time_zero": "launch" if launch else "earliest started record",
            "launch_s": (launch["t_end"] - launch["t_start"]) if launch else None, **timing}


def compare_dirs(a: Path, b: Path) -> dict[str, Any]:
    """``bench ranks``: the two runs' own figures and their rank-by-rank comparison."""
    run_a, run_b = load_run(a), load_run(b)
    summary = {k: {key: run[key] for key in ("dir", "rank_processes", "processes",
                                              "time_zero", "launch_s", "spread_s",
                                              "compute_overshoot_ms")}
               for k, run in (("a", run_a), ("b", run_b))}
    return {**summary, **compare(run_a, run_b)}
