"""Straight lines through a sweep: step time against switching delay, per family (pure).

A *family* is one (semantics, mode) of a sweep (:mod:`testbed.studies.sweep`). Its slope is
the ordinary least-squares fit of ``iteration_time_s`` on the delay in seconds over the
successful points at or above ``min_delay_ms`` (250 ms by default: there the exposed delays
dominate and the line is straight); it reads as "delays exposed per step". The overhead at
100 ms comes only from a measured 100 ms point, never from the line.

Each family also says which degraded runs its figures rest on
(:mod:`testbed.metrics.degraded`): the slope on its fitted points, the overhead at 100 ms on
the 100 ms point's row (that point and the sweep's baseline).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from testbed.metrics.degraded import RESTS_ON, as_list, degraded_labels, union

#: Delays at and above which a family's points are fitted (there the exposed delays dominate).
SLOPE_MIN_DELAY_MS = 250.0


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(slope, intercept) of the least-squares line through ``points``; None with fewer than
    two distinct x values."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    slope = sxy / sxx
    return slope, my - slope * mx


def _number(value: Any) -> float | None:
    if value in (None, ""):
        return None
    return float(value)


def fit_families(rows: Iterable[Mapping[str, Any]], min_delay_ms: float = SLOPE_MIN_DELAY_MS
                 ) -> list[dict[str, Any]]:
    """One entry per (semantics, mode) of ``rows`` (the baseline excluded), in first-seen
    order: ``slope_s_per_s``, ``intercept_s`` (None with fewer than two points at or above
    ``min_delay_ms``), ``slope_points``, ``overhead_100ms_pct`` and ``exposed_100ms_s``; and
    the degraded runs they rest on: ``slope_rests_on_degraded`` (fitted points whose run is
    degraded, named by their row's ``point``), ``overhead_100ms_rests_on_degraded`` (the
    100 ms row's ``rests_on_degraded``) and ``rests_on_degraded`` (both)."""
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    fitted: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    at_100: dict[tuple[str, str], Mapping[str, Any]] = {}
    for row in rows:
        if row.get("mode") == "baseline":
            continue
        key = (str(row.get("semantics") or ""), str(row["mode"]))
        points.setdefault(key, [])
        fitted.setdefault(key, [])
        t = _number(row.get("iteration_time_s"))
        delay = _number(row.get("delay_ms"))
        if t is None or delay is None or row.get("error"):
            continue
        if delay >= min_delay_ms:
            points[key].append((delay / 1e3, t))
            fitted[key].append(row)
        if delay == 100.0:
            at_100[key] = row
    out = []
    for (semantics, mode), pts in points.items():
        line = fit_line(pts)
        row = at_100.get((semantics, mode), {})
        slope_on = degraded_labels((str(r.get("point") or r["mode"]), r)
                                   for r in fitted[(semantics, mode)]) if line else []
        overhead = _number(row.get("overhead_pct"))
        overhead_on = as_list(row.get(RESTS_ON)) if overhead is not None else []
        out.append({"semantics": semantics, "mode": mode,
                    "slope_s_per_s": line[0] if line else None,
                    "intercept_s": line[1] if line else None, "slope_points": len(pts),
                    "overhead_100ms_pct": overhead,
                    "exposed_100ms_s": _number(row.get("exposed_reconfig_s")),
                    "slope_rests_on_degraded": slope_on,
                    "overhead_100ms_rests_on_degraded": overhead_on,
                    RESTS_ON: union(slope_on, overhead_on)})
    return out
