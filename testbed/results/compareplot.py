"""The one plot of ``opus-testbed compare`` (matplotlib, Agg).

Runs: per run its iteration time, electrical baseline and exposed switching per iteration as
bars (left), and its windows' CDF (the electrical baseline's gaps: a switched run has them
after ``--baseline``) with its switching delay marked (right). Sweeps: every
sweep's curves on one pair of axes, iteration time and overhead against the delay (colour =
sweep, marker and line style = mode). One legend, below the panels.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.ticker import NullFormatter

from testbed.results import plots
from testbed.results.compare import Side

plt = plots.plt
SIDE_COLORS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown",
               "tab:pink", "tab:gray", "tab:olive", "tab:cyan")
MODE_LINES = {"on-demand": ("-", "o"), "provisioning": ("--", "s"), "degree-aware": (":", "^")}
CDF_STYLES = ("-", "--", ":", "-.")
BARS = (("iteration_time_s", "iteration"), ("baseline_iteration_time_s", "electrical baseline"),
        ("exposed_reconfig_s", "exposed switching"))


def _color(i: int) -> str:
    return SIDE_COLORS[i % len(SIDE_COLORS)]


def _run_figure(sides: Sequence[Side], table: Mapping[str, Any]) -> Any:
    values = {row["figure"]: row["values"] for row in table["figures"]}
    fig, (bars, cdf) = plt.subplots(1, 2, figsize=(12, 4.8))
    n = len(sides)
    height = 0.8 / n
    top = 0.0
    for i, side in enumerate(sides):
        ys = [k + (i - (n - 1) / 2) * height for k in range(len(BARS))]
        widths = [values[key][side.label] for key, _ in BARS]
        shown = [(y, w) for y, w in zip(ys, widths, strict=True) if w is not None]
        bars.barh([y for y, _ in shown], [w for _, w in shown], height=height * 0.9,
                  color=_color(i), label=f"{side.label}: {_side_label(side)}")
        top = max([top, *(w for _, w in shown)])
    bars.set_yticks(range(len(BARS)), [text for _, text in BARS])
    bars.invert_yaxis()
    bars.set_xlim(0, top * 1.08 if top > 0 else 1.0)
    bars.set_xlabel("seconds per iteration")
    bars.set_title("iteration, baseline, exposed switching")
    bars.grid(alpha=0.3, axis="x")
    lo, hi = float("inf"), 0.0
    for i, side in enumerate(sides):
        pos = sorted(w * 1e3 for w in side.windows_s if w > 0)
        empty = len(side.windows_s) - len(pos)  # counted: each curve starts at their share
        delay = side.summary.get("switching_delay_ms")
        if pos:  # runs of one baseline share their windows: line styles keep both visible
            cdf.step(pos, [(empty + k + 1) / len(side.windows_s) for k in range(len(pos))],
                     where="post", color=_color(i), ls=CDF_STYLES[i % len(CDF_STYLES)],
                     lw=1.6)
            lo, hi = min(lo, pos[0]), max(hi, pos[-1])
        if delay:
            cdf.axvline(float(delay), color=_color(i), ls=":", lw=1.2)
            lo, hi = min(lo, float(delay)), max(hi, float(delay))
    if hi > 0:
        cdf.set_xscale("log")
        cdf.set_xlim(lo / 1.5, hi * 1.5)
    cdf.set_ylim(0, 1.02)
    cdf.set_xlabel("window (ms, log); dotted: the run's switching delay")
    cdf.set_ylabel("CDF (empty windows counted, not drawn)")
    cdf.set_title("windows of the electrical baseline")
    cdf.grid(alpha=0.3, which="both")
    return fig


def _side_label(side: Side) -> str:
    s = side.summary
    delay = s.get("switching_delay_ms")
    what = ("electrical baseline" if s.get("mode") == "baseline"
            else f"{s.get('mode')}, {float(delay or 0):g} ms")
    return f"{side.path} ({what})"


def _sweep_figure(sides: Sequence[Side]) -> Any:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.0))
    xs: list[float] = []
    ys_left: list[float] = []
    ys_right: list[float] = []
    for i, side in enumerate(sides):
        color = _color(i)
        by_family: dict[tuple[str, str], list[tuple[float, float, float | None]]] = \
            defaultdict(list)
        for r in side.rows:
            if r.get("iteration_time_s") in (None, ""):
                continue
            ov = r.get("overhead_pct")
            by_family[(str(r.get("semantics") or ""), str(r["mode"]))].append(
                (float(r["delay_ms"]), float(r["iteration_time_s"]),
                 None if ov in (None, "") else float(ov)))
        for (semantics, mode), pts in sorted(by_family.items()):
            pts.sort()
            xs += [p[0] for p in pts]
            ys_left += [p[1] for p in pts]
            ys_right += [p[2] for p in pts if p[2] is not None]
            if mode == "baseline":
                left.axhline(pts[0][1], color=color, lw=0.8, ls="-.")
                left.plot([pts[0][0]], [pts[0][1]], marker="D", color=color, ls="",
                          label=f"{side.label}: baseline, 0 ms ({pts[0][1]:.3g} s)")
                right.plot([pts[0][0]], [0.0], marker="D", color=color, ls="")
                continue
            ls, marker = MODE_LINES.get(mode, ("-", "o"))
            label = f"{side.label}: {mode}" + (f", {semantics}" if semantics else "")
            left.plot([p[0] for p in pts], [p[1] for p in pts], color=color, ls=ls,
                      marker=marker, markersize=5, label=label)
            right.plot([p[0] for p in pts if p[2] is not None],
                       [p[2] for p in pts if p[2] is not None], color=color, ls=ls,
                       marker=marker, markersize=5)
    plots.scale_y(left, ys_left)
    plots.scale_y(right, [*ys_right, 0.0], symlog_below=10.0)
    swept = sorted(set(xs))
    for ax in (left, right):
        plots.scale_delay_axis(ax, xs)
        if ax.get_xscale() == "symlog" and len(swept) <= 12:
            ax.set_xticks(plots.readable_ticks(ax, swept))
            ax.xaxis.set_major_formatter(plots.PLAIN)
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(plots.PLAIN)
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("OCS switching delay (ms; 0 = electrical baseline)")
        ax.grid(alpha=0.3, which="both")
    left.set_ylabel("iteration time (s)")
    right.set_ylabel("overhead vs its sweep's baseline (%)")
    return fig


def compare_figure(sides: Sequence[Side], table: Mapping[str, Any]) -> Any:
    """The comparison's figure (not saved): runs or sweeps, as :mod:`compare` built
    ``table``; the legend below the panels, over no data."""
    fig = _sweep_figure(sides) if table["kind"] == "sweeps" else _run_figure(sides, table)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    ncol = 1 if table["kind"] == "runs" else min(4, len(sides))  # a sweep per column
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    rows = -(-len(labels) // ncol)
    names = " vs ".join(s.label for s in sides)
    fig.suptitle(f"opus-testbed compare: {names}", fontsize=11)
    fig.tight_layout(rect=(0.0, 0.02 + 0.045 * rows, 1.0, 1.0))
    return fig


def compare_plot(sides: Sequence[Side], table: Mapping[str, Any], path: Path) -> None:
    """:func:`compare_figure`, written to ``path`` (PNG)."""
    fig = compare_figure(sides, table)
    fig.savefig(path, dpi=110)
    plt.close(fig)
