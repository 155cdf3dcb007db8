"""The checks a reviewer makes of a plot, on a drawn matplotlib figure (test helper).

:func:`problems` lists what is wrong: a point outside its axes' limits, two tick labels that
overlap, a legend (or caption) over a panel's data (any point or segment of a line, any
bar) or over its tick and axis labels.
Extents come from matplotlib's renderer, in display pixels.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.transforms import Bbox


def _overlap(a: Bbox, b: Bbox, tol_px: float = 0.5) -> bool:
    return bool(a.x0 < b.x1 - tol_px and b.x0 < a.x1 - tol_px and a.y0 < b.y1 - tol_px
                and b.y0 < a.y1 - tol_px)


def _inside(ax: Any, xs: Any, ys: Any) -> bool:
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    ok = np.isfinite(xs) & np.isfinite(ys)
    eps_x, eps_y = 1e-9 * max(1.0, abs(x1 - x0)), 1e-9 * max(1.0, abs(y1 - y0))
    return bool(np.all((xs[ok] >= x0 - eps_x) & (xs[ok] <= x1 + eps_x)
                       & (ys[ok] >= y0 - eps_y) & (ys[ok] <= y1 + eps_y)))


def data_points(ax: Any) -> list[tuple[str, Any, Any]]:
    """(what, xs, ys) of every artist drawn in data coordinates: lines, scatters, bars and
    broken bars (their corners). Reference lines (axhline/axvline) are not data points."""
    out = []
    for line in ax.get_lines():
        if isinstance(line, Line2D) and line.get_transform() == ax.transData:
            out.append((f"line {line.get_label()!r}", *line.get_data()))
    for coll in ax.collections:
        if isinstance(coll, PathCollection):
            offs = coll.get_offsets()
            if len(offs):
                out.append(("scatter", offs[:, 0], offs[:, 1]))
        elif isinstance(coll, PolyCollection):
            for path in coll.get_paths():
                v = path.vertices
                out.append((f"bars {coll.get_label()!r}", v[:, 0], v[:, 1]))
    for patch in ax.patches:
        if isinstance(patch, Rectangle) and patch.get_transform() == ax.transData:
            x, y, w, h = patch.get_x(), patch.get_y(), patch.get_width(), patch.get_height()
            out.append(("bar", [x, x + w], [y, y + h]))
    return out


def data_boxes(ax: Any, steps: int = 16) -> list[tuple[str, Bbox]]:
    """Display-space boxes of what ``ax`` draws as data, clipped to its area: a tiny box per
    point of every line (its segments sampled ``steps`` times, so a line crossing a legend is
    caught between its points), every scatter point and every bar."""
    area = ax.get_window_extent()
    out = []
    for what, xs, ys in data_points(ax):
        pts = ax.transData.transform(np.column_stack([np.asarray(xs, float),
                                                      np.asarray(ys, float)]))
        pts = pts[np.all(np.isfinite(pts), axis=1)]
        if what.startswith("bar") and len(pts):  # one bar: its box, within the axes
            inside = Bbox.intersection(Bbox([pts.min(0), pts.max(0)]), area)
            if inside is not None:
                out.append((what, inside))
            continue
        if len(pts) > 1:
            t = np.linspace(0.0, 1.0, steps, endpoint=False)
            pts = np.vstack([a + np.outer(t, b - a) for a, b in itertools.pairwise(pts)]
                            + [pts[-1:]])
        for x, y in pts:
            if area.x0 <= x <= area.x1 and area.y0 <= y <= area.y1:
                out.append((what, Bbox([[x - 1, y - 1], [x + 1, y + 1]])))
    return out


def _labels(ax: Any, renderer: Any) -> list[tuple[str, Bbox]]:
    """The visible, non-empty tick labels and axis labels of ``ax`` with their extents."""
    out = []
    for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
        for tick in axis.get_major_ticks():
            label = tick.label1
            if label.get_visible() and label.get_text() and lo <= tick.get_loc() <= hi:
                out.append((f"{which} tick {label.get_text()!r}",
                            label.get_window_extent(renderer)))
        if axis.label.get_text():
            out.append((f"{which} label", axis.label.get_window_extent(renderer)))
    return out


def problems(fig: Any) -> list[str]:
    """What a reviewer would object to in ``fig`` (empty: nothing)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    captions = [t for t in fig.texts if t.get_text()]
    for ax in fig.axes:
        for what, xs, ys in data_points(ax):
            if not _inside(ax, xs, ys):
                found.append(f"{ax.get_title() or 'axes'}: {what} outside the limits "
                             f"{ax.get_xlim()} x {ax.get_ylim()}")
        labels = _labels(ax, renderer)
        ticks = [(w, b) for w, b in labels if " tick " in w]
        for i, (wa, a) in enumerate(ticks):
            for wb, b in ticks[i + 1:]:
                if wa[0] == wb[0] and _overlap(a, b):
                    found.append(f"{ax.get_title() or 'axes'}: {wa} overlaps {wb}")
        drawn = data_boxes(ax)
        for box_of, name in [*((lg, "legend") for lg in legends),
                             *((t, f"caption {t.get_text()[:20]!r}") for t in captions)]:
            box = box_of.get_window_extent(renderer)
            covered = [what for what, b in drawn if _overlap(box, b)]
            if covered:
                found.append(f"{name} covers the data of {ax.get_title() or 'axes'}: "
                             + ", ".join(sorted(set(covered))[:3]))
            for what, b in labels:
                if _overlap(box, b):
                    found.append(f"{name} covers {what} of {ax.get_title() or 'axes'}")
    return found
