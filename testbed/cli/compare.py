"""``opus-testbed compare RUN_A RUN_B [...]``: finished runs, or sweeps, side by side.

The shell around :mod:`testbed.results.compare` (the figures) and
:mod:`testbed.results.compareplot` (the one plot): reads results only, writes nothing but the
plot asked for with ``--plot``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from textwrap import fill
from typing import Any

from testbed.metrics.degraded import EXIT_DEGRADED

#: The plot's file name when ``--plot`` names a folder.
PLOT_FILE = "compare.png"

EPILOG = """\
examples:
  opus-testbed compare results/my-sim   # run --baseline's folder: its baseline against its run
  opus-testbed compare results/my-sim results/my-sim25 --plot results/   # two runs, a plot
  opus-testbed compare results/sweep-a results/sweep-b --json   # two sweeps, point by point
"""


def _fmt(value: Any, fmt: str) -> str:
    if value is None or value == "":
        return "n/a"
    if fmt == "s":
        return str(value)
    if fmt.endswith("d"):
        return format(int(value), fmt)
    text = format(float(value), fmt)
    return format(0.0, fmt) if float(text) == 0 else text  # no "-0.000"


def _signed(fmt: str) -> str:
    """The format of a difference: a sign always (``+.3f``, ``+d``)."""
    return fmt if fmt.startswith("+") or fmt == "s" else f"+{fmt}"


def _side_text(run: Mapping[str, Any]) -> str:
    delay = run.get("switching_delay_ms")
    plane = run.get("plane")  # a rival control plane's run (issue 40)
    parts = [str(run.get("name")), f"plane {plane}" if plane else str(run.get("mode")),
             "electrical" if run.get("mode") == "baseline" or delay is None
             else f"{float(delay):g} ms", str(run.get("semantics") or "port-exact"),
             f"K={run.get('ports_per_rank')}", f"{run.get('world_size')} ranks",
             f"{run.get('backend')} backend"]
    pair = "; run --baseline's folder: overhead against its baseline" \
        if run.get("kind") == "pair" else ""
    return f"{run['path']} ({', '.join(parts)}{pair})"


def _value_text(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def difference_lines(diffs: Sequence[Mapping[str, Any]], limit: int = 40) -> list[str]:
    """The settings that differ, one per line: ``  key   A=...  B=...``."""
    if not diffs:
        return ["settings: the same on every side"]
    width = min(44, max(len(d["setting"]) for d in diffs) + 2)
    lines = ["settings that differ:"]
    for d in diffs[:limit]:
        lines.append(f"  {d['setting']:<{width}}" + "  ".join(
            f"{label}={_value_text(v)}" for label, v in d["values"].items()))
    if len(diffs) > limit:
        lines.append(f"  ... and {len(diffs) - limit} more (--json lists them all)")
    return lines


def run_lines(table: Mapping[str, Any]) -> list[str]:
    """The runs' table: who is who, one row per figure (values, then differences from A),
    the settings that differ."""
    runs = table["runs"]
    lines = [f"{r['label']}  {_side_text(r)}" for r in runs]
    diff_names = list(table["figures"][0]["differences"]) if table["figures"] else []
    lines.append(f"{'':<40}" + "".join(f"{r['label']:>12}" for r in runs)
                 + "".join(f"{d:>12}" for d in diff_names))
    for row in table["figures"]:
        fmt = row["format"]
        lines.append(f"{row['label']:<40}"
                     + "".join(f"{_fmt(row['values'][r['label']], fmt):>12}" for r in runs)
                     + "".join(f"{_fmt(row['differences'][d], _signed(fmt)):>12}"
                               if fmt != "s" else f"{'':>12}" for d in diff_names))
    for r in runs:
        if r.get("fidelity") == "degraded":
            lines.append(f"{r['label']} is degraded: " + "; ".join(r["fidelity_reasons"]))
        if r.get("baseline_fidelity") == "degraded":
            lines.append(f"{r['label']}'s baseline is degraded: its overhead rests on it "
                         f"({r['path']}/baseline/summary.json has the reasons)")
    exposed = [r["label"] for r in runs if _exposed_over_overhead(table, r["label"])]
    if exposed:
        lines.append(f"exposed switching above the overhead ({', '.join(exposed)}): it "
                     "counts every rank's waits for light, also while other ranks computed or "
                     "sent (the 'of it, while others worked' row); only critical-path waits "
                     "lengthen the iteration")
    return lines + difference_lines(table["config_differences"])


def _exposed_over_overhead(table: Mapping[str, Any], label: str) -> bool:
    """True when run ``label``'s exposed switching per iteration exceeds its overhead."""
    values = {row["figure"]: row["values"][label] for row in table["figures"]}
    it, base, exposed = (values.get("iteration_time_s"), values.get("baseline_iteration_time_s"),
                         values.get("exposed_reconfig_s"))
    if it is None or base is None or exposed is None:
        return False
    return bool(exposed > it - base + 1e-9)


def sweep_lines(table: Mapping[str, Any]) -> list[str]:
    """The sweeps' table: one row per point (iteration time and overhead per sweep, and
    differences from A), each family's slope and overhead at 100 ms, the settings that
    differ."""
    sweeps = table["sweeps"]
    labels = [s["label"] for s in sweeps]
    diffs = [f"{b}-{labels[0]}" for b in labels[1:]]
    lines = [f"{s['label']}  {s['path']} ({s['name']}, {s['backend']} backend)" for s in sweeps]
    cols = [*labels, *diffs]
    group = 10 * len(cols)
    lines.append(f"{'':<35}{'iteration_s':>{group}}   {'overhead_%':>{group}}")
    lines.append(f"{'mode':<14}{'semantics':<12}{'delay_ms':>9}"
                 + "".join(f"{x:>10}" for x in cols) + "   "
                 + "".join(f"{x:>10}" for x in cols))
    for p in table["points"]:
        vals, d = p["values"], p["differences"]
        it = [_fmt(vals.get(x, {}).get("iteration_time_s"), ".3f") for x in labels]
        it += [_fmt(d[x]["iteration_time_s"], "+.3f") for x in diffs]
        ov = [_fmt(vals.get(x, {}).get("overhead_pct"), "+.1f") for x in labels]
        ov += [_fmt(d[x]["overhead_pct"], "+.1f") for x in diffs]
        lines.append(f"{p['mode']:<14}{p['semantics']:<12}{p['delay_ms']:>9g}"
                     + "".join(f"{x:>10}" for x in it) + "   "
                     + "".join(f"{x:>10}" for x in ov))
    lines.append("0 ms is each sweep's electrical baseline; each overhead_% is against its "
                 "own sweep's baseline")
    for f in table["families"]:
        v = f["values"]
        lines.append(f"{f['mode']}, {f['semantics'] or 'port-exact'}: slope "
                     + ", ".join(f"{x} {_fmt(v.get(x, {}).get('slope_s_per_s'), '.2f')}"
                                 for x in labels)
                     + " s/s; overhead at 100 ms "
                     + ", ".join(f"{x} {_fmt(v.get(x, {}).get('overhead_100ms_pct'), '+.1f')}"
                                 for x in labels) + " %")
    return lines + difference_lines(table["config_differences"])


def plot_path(text: str) -> Path:
    """``--plot``: a folder (existing, written with a trailing ``/``, or a name without a
    suffix such as ``.png``) gets :data:`PLOT_FILE`; anything else is the file."""
    path = Path(text)
    folder = path.is_dir() or text.endswith("/") or not path.suffix
    return path / PLOT_FILE if folder else path


def cmd_compare(args: argparse.Namespace) -> int:
    from testbed.results.compare import CompareError, compare, load_sides

    try:
        sides = load_sides([Path(p) for p in args.results])
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = compare(sides)
    if args.plot:
        from testbed.results.compareplot import compare_plot

        path = plot_path(args.plot)
        path.parent.mkdir(parents=True, exist_ok=True)
        compare_plot(sides, table, path)
        table["plot"] = str(path)
    if args.json:
        print(json.dumps(table, indent=1, default=str))
    else:
        print("\n".join(run_lines(table) if table["kind"] == "runs" else sweep_lines(table)))
        if args.plot:
            print(f"plot: {table['plot']}")
    degraded = table["kind"] == "runs" and any(
        "degraded" in (r.get("fidelity"), r.get("baseline_fidelity")) for r in table["runs"])
    return EXIT_DEGRADED if degraded else 0


def register(sub: Any) -> None:
    """Add ``compare`` to the top-level parser."""
    p = sub.add_parser(
        "compare", help="finished runs (or sweeps) side by side: figures, settings, one plot",
        description=fill("Put finished runs side by side: iteration time, the electrical baseline "
        "and the overhead against it, exposed switching (the time per iteration some "
        "collective waited for light), reconfigurations, windows (the electrical baseline's gaps, "
        "and how many are at least the run's delay) and gaps (the switched run's own), "
        "mispredictions and fidelity; each later run's difference from "
        "the first (A); then every setting that differs (the summary's, manifest.json's and "
        "experiment.yaml's cluster and workload). A folder may be a run, run --baseline's "
        "folder (its run, with the overhead against its baseline; given alone: its baseline "
        "against its run) or a sweep (all sweeps then: point by point, and each family's "
        "slope). Reads results only. Exit status: 0, 3 a compared run or the baseline its "
        "overhead rests on is degraded (named with its reasons; sweeps: see each sweep's own "
        "table), 2 a folder holds no run or sweep (the message names the folders "
        "inside it) or runs and sweeps are mixed."),
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", metavar="RUN",
                   help="run directories, run --baseline folders or sweep directories")
    p.add_argument("--plot", metavar="FILE|DIR",
                   help=f"also draw the comparison into FILE (.png, .svg, .pdf), or "
                   f"DIR/{PLOT_FILE} (a folder, or a name without a suffix): runs "
                   "as bars and window CDFs, sweeps as curves against the delay")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=cmd_compare)
