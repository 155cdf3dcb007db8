"""How much of the exposed switching other ranks' work overlaps: why exposure can exceed the
overhead.

``exposed_reconfig_s`` (:func:`testbed.metrics.compute.compute_metrics`) is the union, over
every rank, of the time some collective was ready but waited for its circuits. A wait on one
rank while other ranks still compute or send lengthens the iteration only where it is on the
critical path, so the union can be larger than the overhead against the electrical baseline
(``opus-testbed run examples/tiny.yaml --backend sim --baseline``, 2026-12-07: 0.131 s exposed,
0.121 s overhead, 0.040 s of the exposure while some rank computed or sent).
:func:`exposure_overlapped_s` measures that part: per measured iteration, the exposed time
during which some rank computed or transferred data.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The disjoint, sorted union of ``intervals`` (empty ones dropped)."""
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def overlap_s(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """The length of the intersection of two disjoint sorted unions."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def busy_intervals(records: Iterable[dict[str, Any]]) -> list[Interval]:
    """When some rank computed (compute records) or moved a call's data (ack to end)."""
    spans = []
    for r in records:
        if r.get("ev") == "compute":
            spans.append((float(r["t_start"]), float(r["t_end"])))
        elif r.get("ev") == "call" and r.get("t_ack") is not None:
            spans.append((float(r["t_ack"]), float(r["t_end"])))
    return union(spans)


def exposure_overlapped_s(records: Iterable[dict[str, Any]], exposed: Iterable[Interval],
                          iterations: Sequence[Interval]) -> float | None:
    """Mean over ``iterations`` (measured, start and end) of the exposed time (``exposed``:
    waits for circuits, any rank) during which some rank computed or sent; None without
    iterations."""
    if not iterations:
        return None
    busy = busy_intervals(records)
    waits = list(exposed)
    per_it = [overlap_s(union((max(x, a), min(y, b)) for x, y in waits), busy)
              for a, b in iterations]
    return sum(per_it) / len(per_it)
