"""The project's one percentile definition, used by every bench and metric.

``percentile(values, p)`` interpolates linearly between the closest ranks: with the ``n``
values sorted as ``x[0] <= ... <= x[n-1]``, the position is ``h = (n - 1) * p / 100`` and the
percentile is ``x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])``. This is
Hyndman and Fan's type 7, the default of numpy (``method="linear"``), R, Excel's
``PERCENTILE.INC`` and ``statistics.quantiles(method="inclusive")``. Why this one:

* it is continuous in ``p`` and in the values, so a figure does not jump when one sample is
  added or moves a little (nearest-rank and floor-index definitions do);
* p0 is the minimum and p100 the maximum, whatever ``n``; p50 is the usual median (the mean of
  the two middle values when ``n`` is even), so ``statistics.median`` agrees with it (to the
  last bit of rounding) and may stay where a median is all that is asked;
* it never leaves the range of the samples and scales with them (doubling every value doubles
  it exactly), so a figure in wall time and in model time differ by the dilation factor alone;
* readers can check a figure with numpy or a spreadsheet's default.

Its known weakness: on few samples a high percentile is an interpolation toward the maximum
(p99 of 5 values is 0.96 of the way from the 4th to the 5th), not an observed tail. Reports give
the sample count beside it for that reason.

This module lives in :mod:`controller` because that package imports no other of the project
and is imported by :mod:`emulator` and :mod:`testbed`: all benches and metrics reach it without
an import cycle (``tests/test_import_cycles.py``). Pure, standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentiles(values: Iterable[float], ps: Sequence[float]) -> list[float]:
    """The percentiles ``ps`` (each in 0..100) of ``values`` (sorted once), as
    :func:`percentile` defines them.

    Raises ValueError on no values, on a NaN value and on a ``p`` outside 0..100.
    """
    data = sorted(float(v) for v in values)
    if not data:
        raise ValueError("percentile of no values: at least one value is needed")
    if any(math.isnan(v) for v in data):
        raise ValueError("percentile of values that include NaN")
    return [_at(data, p) for p in ps]


def percentile(values: Iterable[float], p: float) -> float:
    """The ``p``-th percentile (``p`` in 0..100) of ``values``, by linear interpolation between
    the closest ranks (Hyndman-Fan type 7, numpy's default; see the module docstring).

    Raises ValueError on no values, on a NaN value and on a ``p`` outside 0..100.
    """
    return percentiles(values, (p,))[0]


def _at(data: list[float], p: float) -> float:
    if not 0.0 <= p <= 100.0:  # also refuses NaN
        raise ValueError(f"percentile p={p!r} is outside 0..100")
    h = (len(data) - 1) * p / 100.0
    lo = math.floor(h)
    frac = h - lo
    if frac == 0.0:
        return data[lo]
    below, above = data[lo], data[lo + 1]
    # from the nearer end, so that rounding cannot carry the result past it (as numpy does)
    if frac < 0.5:
        return below + frac * (above - below)
    return above - (1.0 - frac) * (above - below)
