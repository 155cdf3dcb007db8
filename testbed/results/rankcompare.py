"""Per-rank timing of two emulated runs side by side (``opus-testbed bench ranks A B``).

Made to compare one process per rank against one per server (``run.ranks_per_process``) on the
same config, but any two finished emulated result directories of the same cluster compare. Per
rank and run, from ``ranks/rank<R>.jsonl`` (times in seconds after the run's launch of its rank
processes, ``ranks/launch.json``; without it, after the earliest ``started`` record):

* ``started_s``: the rank's ``started`` record (its interpreter loaded, its lanes running);
* ``first_call_s``: the first call's intent; ``last_end_s``: the last iteration's end;
* ``iteration_s``: every iteration's duration, in order.

The comparison gives each rank's figures in both runs and ``b - a``, and per run the spread
across ranks (latest minus earliest start, first call, last end). Pure but for reading files.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def rank_timing(records: Iterable[dict[str, Any]], t0: float) -> dict[str, Any]:
    """One rank's figures (see the module docstring) from its records; ``t0``: time zero."""
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
            "iteration_s": [iterations[it][1] - iterations[it][0] for it in sorted(iterations)]}


def _spread(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) - min(known) if known else None


def run_timing(ranks: dict[int, list[dict[str, Any]]], t_launch: float | None
               ) -> dict[str, Any]:
    """Every rank's figures and their spread across ranks; time zero is ``t_launch`` (else the
    earliest ``started`` record)."""
    starts = [float(r["t"]) for recs in ranks.values() for r in recs if r.get("ev") == "started"]
    t0 = t_launch if t_launch is not None else min(starts, default=0.0)
    per_rank = {rank: rank_timing(recs, t0) for rank, recs in sorted(ranks.items())}
    return {"ranks": per_rank,
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
    timing = run_timing(ranks, launch.get("t_start"))
    return {"dir": str(out), "rank_processes": manifest.get("rank_processes", "rank"),
            "processes": launch.get("processes"),
            "time_zero": "launch" if launch else "earliest started record",
            "launch_s": (launch["t_end"] - launch["t_start"]) if launch else None, **timing}


def compare_dirs(a: Path, b: Path) -> dict[str, Any]:
    """``bench ranks``: the two runs' own figures and their rank-by-rank comparison."""
    run_a, run_b = load_run(a), load_run(b)
    summary = {k: {key: run[key] for key in ("dir", "rank_processes", "processes",
                                              "time_zero", "launch_s", "spread_s")}
               for k, run in (("a", run_a), ("b", run_b))}
    return {**summary, **compare(run_a, run_b)}
