"""PNG plots of runs and sweeps (matplotlib, Agg backend: no display needed).

Every function takes table rows (dicts, as written to and read back from the run's CSV files,
so values may be strings) and a path, so ``opus-testbed report`` redraws them from the files.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from testbed.results.waits import call_spans, union
from workloads.layout import AXIS_FAMILY

Row = Mapping[str, Any]
AXIS_COLORS = {"dp": "tab:blue", "pp": "tab:orange", "cp": "tab:green", "ep": "tab:purple",
               "tp": "tab:brown"}
MODE_STYLE = {"baseline": ("black", "--"), "on-demand": ("tab:red", "-"),
              "provisioning": ("tab:blue", "-"), "degree-aware": ("tab:green", "-"),
              "static": ("tab:purple", "-"), "rotor": ("tab:orange", "-")}  # rival planes


def _f(v: Any) -> float:
    return float(v)


def timeline(calls: Sequence[Row], compute: Sequence[Row], circuits: Sequence[Row],
             iteration: Row, ranks: Sequence[int], rails: Sequence[int], path: Path,
             title: str, marks: Sequence[tuple[float, str, str]] = (),
             highlight: Sequence[tuple[int, float, float]] = ()) -> None:
    """Collectives per rank and dark periods per rail during one iteration (paper Fig. 3/5).

    ``iteration`` is an iterations-table row; with ``iteration: -1`` every call and compute block
    overlapping its ``t_start_s``..``t_end_s`` is drawn, whatever its iteration (a failover's
    span). ``marks`` are vertical lines (time, label, colour); ``highlight`` are dark periods
    (rail, from, to) drawn in :data:`MOVING_COLOR` over the rail's (the circuits moving to a
    spare). Each call is drawn as its waits (for peers, for light: :mod:`testbed.results.waits`,
    as thin stripes, the union over the rank's lanes) and its transfer. The x range spans what
    is drawn (ranks not drawn may end later), within the window; what overlaps its edges is
    cut there.
    """
    t0, t1 = _f(iteration["t_start_s"]), _f(iteration["t_end_s"])
    it = int(iteration["iteration"])

    def shown(row_it: Any, a: float, b: float) -> bool:
        return int(row_it) == it if it >= 0 else (b >= t0 and a <= t1)

    rows = len(ranks) + len(rails)
    fig, ax = plt.subplots(figsize=(13, 0.45 * rows + 2.0))
    ylabels = []
    ends = [t_s - t0 for t_s, _label, _color in marks]  # where something drawn ends
    starts: list[float] = []  # where something drawn starts, before the iteration's start
    drawn: list[tuple[list[tuple[float, float]], tuple[float, float], dict[str, Any]]] = []

    def later(bars: list[tuple[float, float]], yrange: tuple[float, float],
              **style: Any) -> None:
        """Draw ``bars`` once the x range is known, cut to it."""
        drawn.append((bars, yrange, style))

    spans = call_spans([c for c in calls if int(c["rank"]) in set(ranks)])
    for y, rank in enumerate(ranks):
        ylabels.append(f"rank {rank}")
        busy = [(_f(c["t_start"]) - t0, _f(c["t_end"]) - _f(c["t_start"])) for c in compute
                if int(c["rank"]) == rank and shown(c["it"], _f(c["t_start"]), _f(c["t_end"]))]
        later(busy, (y - 0.35, 0.7), color="0.85")
        ends += [a + d for a, d in busy]
        by_axis: dict[str, list[tuple[float, float]]] = defaultdict(list)
        named: dict[str, list[str]] = defaultdict(list)  # family -> its group axes (fsdp...)
        peers, light = [], []
        for sp in spans:
            c = sp.row
            if int(c["rank"]) != rank or not shown(c["iteration"], _f(c["t_intent_s"]),
                                                   _f(c["t_end_s"])):
                continue
            axis = AXIS_FAMILY.get(str(c["axis"]), str(c["axis"]))
            if str(c["axis"]) not in named[axis]:
                named[axis].append(str(c["axis"]))
            a, b = sp.transfer
            by_axis[axis].append((a - t0, max(b - a, 1e-4)))
            peers += [sp.peers] if sp.peers else []
            light += [sp.light] if sp.light else []
        for stripe, waits, color in ((-0.14, peers, WAIT_COLORS["peers"]),
                                     (0.02, light, WAIT_COLORS["light"])):
            bars = [(a - t0, b - a) for a, b in union(waits) if b - a > 1e-4]
            later(bars, (y + stripe, 0.12), color=color)
            ends += [a + d for a, d in bars]
            starts += [a for a, _d in bars]
        ends += [a + d for v in by_axis.values() for a, d in v]
        starts += [a for v in by_axis.values() for a, _d in v] + [a for a, _d in busy]
        for axis, spans_ax in by_axis.items():
            later(spans_ax, (y - 0.35, 0.7), color=AXIS_COLORS.get(axis, "tab:gray"),
                  label=f"{'+'.join(sorted(named[axis])).upper()} transfer")
    for k, rail in enumerate(rails):
        y = len(ranks) + k
        ylabels.append(f"rail {rail} OCS")
        dark = [(_f(c["t_dark_s"]) - t0, _f(c["t_light_s"]) - _f(c["t_dark_s"]))
                for c in circuits if int(c["rail"]) == rail and c["t_dark_s"] not in (None, "")
                and _f(c["t_light_s"]) >= t0 and _f(c["t_dark_s"]) <= t1]
        later(dark, (y - 0.35, 0.7), color="black", label="dark (switching)")
        moved = [(a - t0, b - a) for r, a, b in highlight if r == rail]
        ends += [a + d for a, d in [*dark, *moved]]
        if moved:
            later(moved, (y - 0.35, 0.7), color=MOVING_COLOR,
                  label="dark (circuits moving to the spare)")
    # the x range ends at the last thing drawn (within the window), not past it, and starts
    # at the first: a rank may start the iteration before the last one ended the previous
    # (a failover's span starts at its own start); what lies beyond is cut at the edges
    last = min(t1 - t0, max(ends, default=t1 - t0))
    lo = min(0.0, min(starts, default=0.0)) if it >= 0 else 0.0
    hi = last if last > 0 else t1 - t0
    for bars, (y0, height), style in drawn:
        cut = [(max(a, lo), min(a + d, hi) - max(a, lo)) for a, d in bars
               if min(a + d, hi) > max(a, lo)]
        ax.broken_barh(cut, (y0, height), **style)
    for t_s, label, color in marks:
        ax.axvline(t_s - t0, color=color, lw=1.2, ls="--", label=label)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles, strict=False))
    uniq.setdefault("compute", plt.Rectangle((0, 0), 1, 1, color="0.85"))
    for kind, text in WAIT_LABELS.items():
        uniq.setdefault(text, plt.Rectangle((0, 0), 1, 1, color=WAIT_COLORS[kind]))
    ax.legend(uniq.values(), uniq.keys(), loc="upper left", fontsize=8,
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.set_yticks(range(rows), ylabels)
    ax.set_xlim(lo, hi)
    ax.set_ylim(-0.6, rows - 0.4)
    ax.set_xlabel(f"time in iteration {it} (s)" if it >= 0 else "time (s)")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.text(0.01, 0.01, TIMELINE_CAPTION, fontsize=7.5, color="0.3", ha="left", va="bottom",
             wrap=True)
    fig.tight_layout(rect=(0.0, 0.06, 1.0, 1.0))
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: The waits of a call (:mod:`testbed.results.waits`): their colours and legend entries.
WAIT_COLORS = {"peers": "tab:olive", "light": "tab:red"}
#: The dark periods of circuits moving to a spare (a failover's span), apart from the waits.
MOVING_COLOR = "tab:cyan"
WAIT_LABELS = {"peers": "waiting for peers\n(a member has not called yet)",
               "light": "waiting for light\n(all in; circuits not lit,\nor the controller's ack)"}
TIMELINE_CAPTION = (
    "Bars: compute, and each call's transfer (from its ack, once every member has called). "
    "Thin stripes: the time some call of the rank waits, for peers (upper) or for light "
    "(lower); several lanes (DP, PP) may wait at once, and each stripe is their union, so a "
    "transfer on one lane can cover another lane's wait.")


def failover_timeline(calls: Sequence[Row], compute: Sequence[Row], circuits: Sequence[Row],
                      failover: Row, ranks: Sequence[int], path: Path, title: str) -> None:
    """The span of one recovery: the failure, its detection, the circuits moving to the spare
    (dark periods in :data:`MOVING_COLOR`), the resumption and the first collective with the
    spare."""
    t_fail, t_first = _f(failover["t_fail_s"]), failover.get("t_first_s")
    t_end = _f(t_first) if t_first not in (None, "") else _f(failover["t_resume_s"]) + 1.0
    pad = max(0.25, 0.3 * (t_end - t_fail))
    rail = int(failover["rail"]) if failover.get("rail") not in (None, "") else 0
    ports = {int(p) for p in str(failover.get("new_ports") or "").split()}
    t_resume = _f(failover["t_resume_s"])
    highlight = []
    for c in circuits:
        if int(c["rail"]) != rail or c["t_dark_s"] in (None, ""):
            continue
        ends = {int(x) for x in re.findall(r"\d+", f"{c['added']} {c['removed']}")}
        if ports & ends and _f(c["t_light_s"]) >= t_resume and _f(c["t_dark_s"]) <= t_end:
            highlight.append((rail, _f(c["t_dark_s"]), _f(c["t_light_s"])))
    marks = [(t_fail, f"failure (rank {failover['rank']})", "tab:red"),
             (_f(failover["t_detect_s"]), "detected", "tab:orange"),
             (t_resume, "resumed", "tab:green")]
    if t_first not in (None, ""):
        marks.append((_f(t_first), "first collective with the spare", "tab:blue"))
    span = {"iteration": -1, "t_start_s": t_fail - pad, "t_end_s": t_end + pad}
    timeline(calls, compute, circuits, span, ranks, [rail], path, title, marks, highlight)


def window_cdf(windows: Sequence[Row], path: Path, title: str,
               delay_ms: float | None = None) -> None:
    """CDF of windows, overall and by the volume that follows them (paper Fig. 4), against
    the switching delay ``delay_ms`` (a dashed line; none for 0 or None). Empty windows
    (<= 0: the next phase's last member joined before the previous phase ended) have no
    place on a log axis: they are counted in the legend, and every curve starts at their
    share, not drawn at a made-up length."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    groups: dict[str, list[float]] = defaultdict(list)
    for w in windows:
        groups[str(w["volume_bin"])].append(_f(w["window_s"]) * 1e3)
    allw = sorted(v for vs in groups.values() for v in vs)

    def curve(vs: list[float], color: str | None, label: str) -> None:
        vs = sorted(vs)
        empty = sum(1 for v in vs if v <= 0)
        xs = [v for v in vs if v > 0]
        if not xs:
            return
        ys = [(empty + i + 1) / len(vs) for i in range(len(xs))]
        note = f", {empty} empty (<= 0)" if empty else ""
        ax.step(xs, ys, where="post", color=color, label=f"{label} ({len(vs)}{note})")

    if allw:
        curve(allw, "black", "all")
    for label, vs in sorted(groups.items()):
        curve(vs, None, f"next {label}")
    if delay_ms:
        ax.axvline(delay_ms, color="tab:red", lw=1.0, ls="--",
                   label=f"switching delay {delay_ms:g} ms")
    ax.set_xscale("log")
    ax.set_xlabel("window (ms, log scale; empty windows counted, not drawn)")
    ax.set_ylabel("CDF (share of all windows, empty ones included)")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    if allw or delay_ms:  # a run of one collective per iteration has no windows
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SEMANTICS_STYLE = {"port-exact": "-", "rail-state": "--"}


MODE_MARKER = {"on-demand": "o", "provisioning": "s", "degree-aware": "^", "static": "P",
               "rotor": "X"}
#: A data span (largest / smallest positive value) above which an axis is drawn logarithmic.
LOG_SPAN = 20.0


PLAIN = FuncFormatter(lambda v, _pos: f"{v:g}")


def sweep_title(name: str, backend: str, semantics: Sequence[str], modes: Sequence[str],
                delays_ms: Sequence[float]) -> str:
    """``NAME: iteration time vs switching delay`` and a second line with what was swept:
    backend, semantics, OCS modes and their delay range (0 ms is the baseline)."""
    ocs = [m for m in modes if m != "baseline"]
    positive = sorted(float(d) for d in delays_ms if float(d) > 0)
    span = (f"{positive[0]:g}-{positive[-1]:g} ms" if len(positive) > 1 else
            f"{positive[0]:g} ms" if positive else "no OCS delay")
    return (f"{name}: iteration time vs switching delay (cf. paper Fig. 8)\n"
            f"{backend} backend, {', '.join(semantics) or 'port-exact'}; "
            f"{', '.join(ocs) or 'no OCS mode'} at {span}; 0 ms = electrical baseline")


def scale_delay_axis(ax: Any, xs: Sequence[float]) -> None:
    """Symmetric-log x when the positive delays span more than :data:`LOG_SPAN`: linear from
    0 to the smallest delay, as wide as a decade, so that 0 ms (the baseline) and 0.01 ms
    (silicon photonics) lie a decade apart, logarithmic above; linear otherwise. Limits from
    the data, with a margin."""
    pos = [x for x in xs if x > 0]
    if pos and max(pos) / min(pos) > LOG_SPAN:
        ax.set_xscale("symlog", linthresh=min(pos), linscale=1.0)
        ax.set_xlim(-0.4 * min(pos) if min(xs) <= 0 else min(pos) / 1.5, max(pos) * 1.5)
    elif xs:
        pad = 0.05 * ((max(xs) - min(xs)) or 1.0)
        ax.set_xlim(min(xs) - pad, max(xs) + pad)


def scale_y(ax: Any, ys: Sequence[float], symlog_below: float | None = None) -> None:
    """Log y (symmetric-log below ``symlog_below``, for overheads that may be <= 0) when the
    data span more than :data:`LOG_SPAN`; linear otherwise. Limits from the data."""
    if not ys:
        return
    pos = [y for y in ys if y > 0]
    wide = pos and max(pos) / min(pos) > LOG_SPAN
    if wide and symlog_below is not None:
        ax.set_yscale("symlog", linthresh=symlog_below, linscale=0.5)
        ax.set_ylim(min(min(ys) * 1.3, -0.2 * symlog_below), max(ys) * 1.5)
    elif wide and min(ys) > 0:
        ax.set_yscale("log")
        ax.set_ylim(min(ys) / 1.3, max(ys) * 1.3)
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    else:
        pad = 0.08 * ((max(ys) - min(ys)) or abs(max(ys)) or 1.0)
        ax.set_ylim(min(ys) - pad, max(ys) + pad)


def readable_ticks(ax: Any, values: Sequence[float], pad_px: float = 8.0) -> list[float]:
    """The values of ``ax``'s x axis (scale and limits set) to label so that no two labels
    overlap. The ends (0, the smallest and the largest delay) come first, then the powers of
    ten, then the others, each kept when it sits far enough from every kept one for both
    labels (their width estimated from the tick font, the axes a tenth narrower than now, as
    the layout may shrink them)."""
    fig = ax.figure
    width_px = 0.9 * ax.get_position().width * fig.get_figwidth() * fig.dpi
    size = plt.rcParams["xtick.labelsize"]
    size_pt = (size if isinstance(size, (int, float))
               else matplotlib.font_manager.FontProperties(size=size).get_size_in_points())
    char_px = 0.62 * size_pt * fig.dpi / 72.0
    scale = ax.xaxis.get_transform()
    lo, hi = (float(v) for v in scale.transform(np.array(ax.get_xlim(), dtype=float)))

    def at(v: float) -> float:
        return (float(scale.transform(np.array([v], dtype=float))[0]) - lo) / (hi - lo) \
            * width_px

    def half(v: float) -> float:
        return 0.5 * len(f"{v:g}") * char_px

    values = sorted(set(values))
    pos = [v for v in values if v > 0]
    ends = {v for v in values if v <= 0} | ({pos[0], pos[-1]} if pos else set())

    def rank(v: float) -> tuple[int, float]:
        decade = v > 0 and math.isclose(math.log10(v), round(math.log10(v)), abs_tol=1e-9)
        return (0 if v in ends else 1 if decade else 2, v)

    kept: list[float] = []
    for v in sorted(values, key=rank):
        if all(abs(at(v) - at(k)) >= half(v) + half(k) + pad_px for k in kept):
            kept.append(v)
    return sorted(kept)


def sweep_figure(rows: Sequence[Row], title: str, families: Sequence[Row] = (),
                 reference: Row | None = None) -> Any:
    """The sweep's figure (paper Fig. 8): iteration time (left) and overhead against the
    sweep's baseline (right) per switching delay. Colour and marker are the mode, line style
    the semantics (each family's slope in the legend); the baseline is the point at 0 ms and
    a dashed line; points whose run was degraded are ringed; the public artifact's
    measurements (``reference``, :mod:`testbed.results.reference`) are crosses, drawn only
    when given. Axes scale to what is drawn (logarithmic over wide spans); the one legend sits
    below the panels, never over data."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.2))
    slopes = {(str(f.get("semantics") or ""), str(f["mode"])): f.get("slope_s_per_s")
              for f in families}
    by_family: dict[tuple[str, str], list[tuple[float, float, float | None, bool]]] = \
        defaultdict(list)
    for r in rows:
        if r.get("iteration_time_s") in (None, ""):
            continue
        ov = r.get("overhead_pct")
        by_family[(str(r.get("semantics") or ""), str(r["mode"]))].append(
            (_f(r["delay_ms"]), _f(r["iteration_time_s"]), None if ov in (None, "") else _f(ov),
             r.get("fidelity") == "degraded"))
    xs: list[float] = []
    ys_left: list[float] = []
    ys_right: list[float] = []
    degraded: list[tuple[Any, float, float]] = []
    for (semantics, mode), pts in sorted(by_family.items()):
        pts.sort()
        color, ls = MODE_STYLE.get(mode, ("tab:gray", "-"))
        xs += [p[0] for p in pts]
        ys_left += [p[1] for p in pts]
        ys_right += [p[2] for p in pts if p[2] is not None]
        degraded += [(ax, p[0], y) for p in pts if p[3]
                     for ax, y in ((left, p[1]), (right, p[2])) if y is not None]
        if mode == "baseline":
            t = pts[0][1]
            left.axhline(t, color=color, ls=ls, lw=1, label=f"baseline: electrical rails, "
                         f"0 ms ({t:.3g} s)")
            left.plot([0.0], [t], marker="D", color=color, ls="")
            right.axhline(0.0, color=color, ls=ls, lw=1)
            right.plot([0.0], [0.0], marker="D", color=color, ls="")
            continue
        slope = slopes.get((semantics, mode))
        label = f"{mode}, {semantics}" if semantics else mode
        if slope is not None:
            label += f" (slope {slope:.2f} s/s)"
        style = {"color": color, "ls": SEMANTICS_STYLE.get(semantics, "-"),
                 "marker": MODE_MARKER.get(mode, "o"), "markersize": 5, "alpha": 0.85}
        left.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
        right.plot([p[0] for p in pts if p[2] is not None],
                   [p[2] for p in pts if p[2] is not None], **style)
    if reference:
        ref_slopes = {str(f["mode"]): f["slope_s_per_s"] for f in reference.get("families", ())}
        by_mode: dict[str, list[Row]] = defaultdict(list)
        for p in reference.get("points", ()):
            by_mode[str(p["mode"])].append(p)
        for mode, pts_ref in by_mode.items():
            color, _ = MODE_STYLE.get(mode, ("tab:gray", "-"))
            label = (f"{mode}, artifact (GPUs, {ref_slopes.get(mode, float('nan')):.2f} s/s; "
                     "overhead vs its no-controller run)")
            rx = [_f(p["delay_ms"]) for p in pts_ref]
            xs += rx
            ys_left += [_f(p["step_s"]) for p in pts_ref]
            ys_right += [_f(p["overhead_pct"]) for p in pts_ref]
            left.scatter(rx, [_f(p["step_s"]) for p in pts_ref], marker="x", color=color,
                         label=label)
            right.scatter(rx, [_f(p["overhead_pct"]) for p in pts_ref], marker="x",
                          color=color)
    for ax, x, y in degraded:
        ax.scatter([x], [y], s=160, facecolors="none", edgecolors="tab:red", linewidths=1.5,
                   zorder=5, label="degraded run (reasons: sweep output)"
                   if ax is left and (ax, x, y) == degraded[0] else None)
    scale_y(left, ys_left)
    scale_y(right, [*ys_right, 0.0], symlog_below=10.0)
    for ax in (left, right):
        ax.yaxis.set_major_formatter(PLAIN)
        ax.yaxis.set_minor_formatter(NullFormatter())
    left.set_ylabel("iteration time (s)")
    right.set_ylabel("overhead vs the baseline (%)")
    swept = sorted(set(xs))
    for ax in (left, right):
        scale_delay_axis(ax, xs)
        if ax.get_xscale() == "symlog" and len(swept) <= 12:  # the swept delays, as numbers
            ax.set_xticks(readable_ticks(ax, swept))
            ax.xaxis.set_major_formatter(PLAIN)
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("OCS switching delay (ms)")
        ax.grid(alpha=0.3, which="both")
    handles, labels = left.get_legend_handles_labels()
    fig.suptitle(title, fontsize=11)
    fig.legend(handles, labels, loc="lower center", ncol=min(3, max(1, len(labels))),
               fontsize=8, frameon=False)
    rows_of_legend = -(-len(labels) // 3)
    fig.tight_layout(rect=(0.0, 0.01 + 0.045 * rows_of_legend, 1.0, 1.0))
    return fig


def sweep_plot(rows: Sequence[Row], path: Path, title: str,
               families: Sequence[Row] = (), reference: Row | None = None) -> None:
    """:func:`sweep_figure`, written to ``path``."""
    fig = sweep_figure(rows, title, families, reference)
    fig.savefig(path, dpi=110)
    plt.close(fig)


ALGORITHM_COLORS = {"matchings": "tab:blue", "multihop": "tab:orange", "electrical": "black",
                    "ring": "black", "stragglar": "tab:red"}
BACKEND_STYLE = {"sim-ideal": ("-", None), "sim-emulator": (":", None), "emu": ("", "o")}


def alltoall_plot(points: Sequence[Row], path: Path,
                  crossovers_ms: Mapping[int, float] | None = None) -> None:
    """Time per all-to-all against the switching delay, one line per algorithm and backend;
    one panel per cluster size, the IDEAL sim's crossover marked (``bench alltoall``)."""
    sizes = sorted({int(p["ranks"]) for p in points})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.6 * len(sizes), 4.0), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        for (backend, algorithm), pts in sorted(_series(points, n).items()):
            ls, marker = BACKEND_STYLE.get(backend, ("--", None))
            color = ALGORITHM_COLORS.get(algorithm, "tab:gray")
            label = f"{algorithm} ({backend})"
            if algorithm == "electrical":
                ax.axhline(pts[0][1] * 1e3, color=color, ls=ls or "--", label=label)
                continue
            ax.plot([x for x, _ in pts], [y * 1e3 for _, y in pts], ls=ls, marker=marker,
                    color=color, label=label)
        if crossovers_ms and n in crossovers_ms:
            ax.axvline(crossovers_ms[n], color="0.5", ls="-.", lw=0.8,
                       label=f"crossover {crossovers_ms[n]:.3g} ms (sim-ideal)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("OCS switching delay (ms)")
        ax.set_ylabel("time per all-to-all (ms)")
        ax.set_title(f"{n} ranks on one rail" + (" (beyond Table 3 radix)" if n > 64 else ""))
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _series(points: Sequence[Row], n: int) -> dict[tuple[str, str], list[tuple[float, float]]]:
    out: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for p in points:
        if int(p["ranks"]) == n:
            out[(str(p["backend"]), str(p["algorithm"]))].append(
                (_f(p["switching_delay_ms"]), _f(p["time_per_a2a_s"])))
    return {k: sorted(v) for k, v in out.items()}


def stragglar_plot(points: Sequence[Row], path: Path) -> None:
    """Time after the straggler arrives against the switching delay (electrical rails at the
    left), one line per algorithm and backend: the ring, and StragglAR with the shortest and the
    longest straggler delay (``opus-testbed bench stragglar``)."""
    fabrics = sorted({(p["switching_delay_ms"] is not None, _f(p["switching_delay_ms"] or 0),
                       str(p["fabric"])) for p in points})
    x_of = {f[2]: i for i, f in enumerate(fabrics)}
    delays = sorted({_f(p["straggler_delay_ms"]) for p in points})
    shown = {("ring", delays[-1]), ("stragglar", delays[0]), ("stragglar", delays[-1])}
    fig, ax = plt.subplots(figsize=(8.5, 4.4))
    lines: dict[tuple[str, str, float], list[tuple[int, float]]] = defaultdict(list)
    for p in points:
        key = (str(p["algorithm"]), _f(p["straggler_delay_ms"]))
        if key in shown:
            lines[(str(p["backend"]), *key)].append(
                (x_of[str(p["fabric"])], _f(p["after_arrival_s"])))
    for (backend, algorithm, late), pts in sorted(lines.items()):
        ls, marker = BACKEND_STYLE.get(backend, ("--", None))
        label = (f"{algorithm} ({backend})" if algorithm == "ring"
                 else f"{algorithm}, straggler {late:g} ms late ({backend})")
        ax.plot([x for x, _ in sorted(pts)], [y * 1e3 for _, y in sorted(pts)], ls=ls,
                marker=marker or ".", color=ALGORITHM_COLORS.get(algorithm, "tab:gray"),
                alpha=1.0 if algorithm == "ring" or late == delays[-1] else 0.45, label=label)
    ax.set_xticks(range(len(fabrics)), [f[2] for f in fabrics])
    ax.set_yscale("log")
    ax.set_xlabel("rail (switching delay)")
    ax.set_ylabel("all-reduce time after the straggler arrives (ms)")
    ax.set_title("StragglAR vs Ring, one persistent straggler")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
