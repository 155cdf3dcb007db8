"""Finished runs, or sweeps, side by side (``opus-testbed compare``).

A *side* is what one argument of ``compare`` names: a run directory, ``run --baseline``'s
folder (its switched run, with the overhead against the baseline inside it), or a sweep
directory. :func:`load_side` reads one from disk; the rest is pure: :func:`run_table` and
:func:`sweep_table` put the figures side by side with each side's difference from the first
(``A``), and :func:`config_differences` lists the settings that differ between sides (from
each run's ``manifest.json``, its ``experiment.yaml`` and its summary).
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.results.folders import SWEEP, classify, not_a_results_folder
from testbed.results.store import read_csv

#: The figures compared for runs: summary key (or a derived one, :func:`run_values`), the
#: row's label and how a value is printed.
RUN_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("iteration_time_s", "iteration time (s)", ".3f"),
    ("baseline_iteration_time_s", "electrical baseline (s)", ".3f"),
    ("overhead_pct", "overhead vs the baseline (%)", "+.1f"),
    ("exposed_reconfig_s", "exposed switching per iteration (s)", ".3f"),
    ("exposed_share_pct", "exposed switching, % of the iteration", ".1f"),
    ("exposed_reconfig_overlapped_s", "  of it, while others worked (s)", ".3f"),
    ("reconfigurations_per_iteration", "reconfigurations per iteration", ".1f"),
    ("reconfigurations", "reconfigurations (all iterations)", "d"),
    ("windows", "windows (the electrical baseline's)", "d"),
    ("windows_empty", "empty windows (<= 0)", "d"),
    ("windows_at_least_delay_pct", "windows at least the run's delay (%)", ".0f"),
    ("window_median_s", "window median (s)", ".4f"),
    ("gaps", "gaps (the switched run's own)", "d"),
    ("mispredictions", "mispredictions", "d"),
    ("fidelity", "fidelity", "s"),
)
#: Settings that say what was run; their values are listed beside the figures.
RUN_SETTINGS = ("name", "backend", "mode", "switching_delay_ms", "semantics", "ports_per_rank",
                "world_size")
#: Manifest keys that differ between any two runs and say nothing about the experiment.
IGNORED = ("status", "started", "finished", "command", "packages.", "machine.load_average",
           "machine.memory_mb", "git.dirty", "config.source")
LABELS = string.ascii_uppercase


class CompareError(ValueError):
    """A ``compare`` argument that names no run or sweep, or a mix of runs and sweeps."""


@dataclass(frozen=True)
class Side:
    """One compared run or sweep: its label (``A``, ``B``...), the folder given, its kind
    (``run``, ``pair`` or ``sweep``), the run standing for it (a sweep: None), that run's
    summary, its baseline's summary (a pair), the settings to diff (flat) and, for a run, its
    windows (s: ``windows.csv``, the electrical baseline's gaps, which a switched run holds
    only after its baseline), for a sweep its rows (``sweep.csv``) and families
    (``sweep.json``)."""

    label: str
    path: Path
    kind: str
    run_dir: Path | None
    summary: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    windows_s: tuple[float, ...] = ()
    rows: tuple[dict[str, Any], ...] = ()
    families: tuple[dict[str, Any], ...] = ()


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of dotted keys (lists are kept as values)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _experiment_workload(run_dir: Path) -> dict[str, Any]:
    """The ``workload`` and ``cluster`` sections of the run's ``experiment.yaml``, flat."""
    import yaml

    path = run_dir / "experiment.yaml"
    try:
        doc = yaml.safe_load(path.read_text()) if path.is_file() else None
    except yaml.YAMLError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return flatten({k: doc[k] for k in ("cluster", "workload") if isinstance(doc.get(k), dict)},
                   "experiment.")


def run_settings(run_dir: Path, summary: Mapping[str, Any]) -> dict[str, Any]:
    """What a run was: its manifest (less :data:`IGNORED`), the summary's settings the
    manifest lacks, and its experiment file's cluster and workload, flat."""
    manifest = flatten(_json(run_dir / "manifest.json"))
    out = {k: v for k, v in manifest.items()
           if not any(k == i or (i.endswith(".") and k.startswith(i)) for i in IGNORED)}
    out.update({k: summary.get(k) for k in RUN_SETTINGS  # what the manifest does not say
                if k not in out and f"config.{k}" not in out})
    out.update(_experiment_workload(run_dir))
    return out


def _windows(run_dir: Path) -> tuple[float, ...]:
    return tuple(float(w["window_s"]) for w in read_csv(run_dir / "windows.csv")
                 if w.get("window_s") not in (None, ""))


def load_side(path: Path, label: str) -> Side:
    """The run or sweep ``path`` names; :class:`CompareError` naming the folders inside it
    when it names neither."""
    folder = classify(path)
    if folder is None:
        raise CompareError(not_a_results_folder(path))
    if folder.kind == SWEEP:
        meta = _json(path / "sweep.json")
        first = folder.runs[0] if folder.runs else None
        settings = {"name": meta.get("name"), "backend": meta.get("backend"),
                    "modes": meta.get("modes"), "semantics": meta.get("semantics"),
                    "delays_ms": meta.get("delays_ms"),
                    **flatten(meta.get("config") or {}, "config.")}
        if first is not None:
            settings.update(_experiment_workload(first))
        return Side(label, path, SWEEP, None, settings=settings,
                    rows=tuple(read_csv(path / "sweep.csv")),
                    families=tuple(meta.get("families") or ()))
    run_dir = folder.switched
    summary = _json(run_dir / "summary.json")
    baseline = _json(folder.baseline / "summary.json") if folder.baseline else None
    return Side(label, path, folder.kind, run_dir, summary, baseline,
                run_settings(run_dir, summary), _windows(run_dir))


def load_sides(paths: Sequence[Path]) -> list[Side]:
    """Every argument as a :class:`Side`, labelled A, B, ...; runs and sweeps are not mixed."""
    if not paths:
        raise CompareError("give two runs or sweeps to compare (or one run --baseline folder)")
    if len(paths) > len(LABELS):
        raise CompareError(f"at most {len(LABELS)} runs or sweeps, got {len(paths)}")
    if len(paths) == 1:  # run --baseline's folder alone: its baseline (A) against its run (B)
        folder = classify(paths[0])
        if folder is None:
            raise CompareError(not_a_results_folder(paths[0]))
        if folder.baseline is None:
            raise CompareError(f"one folder is compared only when it is run --baseline's (its "
                               f"baseline against its run); {paths[0]} is not: give two runs "
                               "or sweeps")
        sides = [load_side(folder.baseline, "A"), load_side(folder.switched, "B")]
    else:
        sides = [load_side(p, LABELS[i]) for i, p in enumerate(paths)]
    kinds = {s.kind == SWEEP for s in sides}
    if len(kinds) > 1:
        text = ", ".join(f"{s.path} is a {'sweep' if s.kind == SWEEP else 'run'}"
                         for s in sides)
        raise CompareError(f"compare runs with runs or sweeps with sweeps, not both: {text}")
    return sides


def windows_at_least_pct(windows_s: Sequence[float], delay_ms: float | None
                         ) -> float | None:
    """The share of windows at least ``delay_ms`` long (in %), as the summary's
    ``windows_at_least_delay_pct``; None without windows or a positive delay."""
    if not windows_s or not delay_ms:
        return None
    return 100.0 * sum(1 for w in windows_s if w * 1e3 >= delay_ms) / len(windows_s)


def run_values(side: Side) -> dict[str, Any]:
    """The figures of :data:`RUN_FIGURES` of one run (None where the run has none)."""
    s = side.summary
    values = {key: s.get(key) for key, _label, _fmt in RUN_FIGURES}
    it, exposed = s.get("iteration_time_s"), s.get("exposed_reconfig_s")
    values["exposed_share_pct"] = (100.0 * exposed / it if it and exposed is not None
                                   else None)
    if values["windows_at_least_delay_pct"] is None:  # results from before the key
        values["windows_at_least_delay_pct"] = windows_at_least_pct(
            side.windows_s, s.get("switching_delay_ms"))
    if s.get("mode") == "baseline":  # a baseline is its own reference
        values["baseline_iteration_time_s"] = it
        values["overhead_pct"] = 0.0 if it is not None else None
    return values


def _difference(a: Any, b: Any) -> Any:
    if isinstance(a, bool) or isinstance(b, bool):
        return None
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return b - a
    return None


def run_table(sides: Sequence[Side]) -> dict[str, Any]:
    """Runs side by side: per figure each run's value and each later run's difference from
    A (``B-A``...), the runs' settings, and the settings that differ."""
    values = {s.label: run_values(s) for s in sides}
    first = sides[0].label
    figures = []
    for key, label, fmt in RUN_FIGURES:
        row: dict[str, Any] = {"figure": key, "label": label, "format": fmt,
                               "values": {s.label: values[s.label][key] for s in sides}}
        row["differences"] = {f"{s.label}-{first}": _difference(values[first][key],
                                                                values[s.label][key])
                              for s in sides[1:]}
        figures.append(row)
    return {"kind": "runs",
            "runs": [{"label": s.label, "path": str(s.path), "run_dir": str(s.run_dir),
                      "kind": s.kind, **{k: s.summary.get(k) for k in RUN_SETTINGS},
                      "plane": s.summary.get("plane"),  # a rival control plane (issue 40)
                      "fidelity": s.summary.get("fidelity"),
                      "fidelity_reasons": s.summary.get("fidelity_reasons") or [],
                      "baseline_fidelity": (s.baseline or {}).get("fidelity")}
                     for s in sides],
            "figures": figures,
            "config_differences": config_differences(sides)}


def config_differences(sides: Sequence[Side]) -> list[dict[str, Any]]:
    """Every setting whose value is not the same on every side (a missing one counts as
    None): ``{"setting": key, "values": {label: value}}``, in key order."""
    keys = sorted({k for s in sides for k in s.settings})
    out = []
    for key in keys:
        vals = {s.label: s.settings.get(key) for s in sides}
        if len({json.dumps(v, sort_keys=True, default=str) for v in vals.values()}) > 1:
            out.append({"setting": key, "values": vals})
    return out


def _family_key(row: Mapping[str, Any]) -> tuple[str, str]:
    return (str(row.get("semantics") or ""), str(row["mode"]))


def _num(value: Any) -> float | None:
    return None if value in (None, "") else float(value)


def sweep_table(sides: Sequence[Side]) -> dict[str, Any]:
    """Sweeps side by side: per (semantics, mode, delay) each sweep's iteration time and
    overhead with the difference from A; per family each sweep's slope and overhead at
    100 ms; and the settings that differ."""
    first = sides[0].label
    points: dict[tuple[str, str, float], dict[str, dict[str, float | None]]] = {}
    for s in sides:
        for r in s.rows:
            key = (*_family_key(r), float(r["delay_ms"]))
            points.setdefault(key, {})[s.label] = {
                "iteration_time_s": _num(r.get("iteration_time_s")),
                "overhead_pct": _num(r.get("overhead_pct")),
                "exposed_reconfig_s": _num(r.get("exposed_reconfig_s"))}
    rows = []
    for (semantics, mode, delay), by_side in sorted(points.items(),
                                                   key=lambda kv: (kv[0][1] != "baseline",
                                                                   kv[0])):
        row: dict[str, Any] = {"mode": mode, "semantics": semantics, "delay_ms": delay,
                               "values": by_side}
        a = by_side.get(first, {})
        row["differences"] = {
            f"{s.label}-{first}": {k: _difference(a.get(k), by_side.get(s.label, {}).get(k))
                                   for k in ("iteration_time_s", "overhead_pct")}
            for s in sides[1:]}
        rows.append(row)
    families: dict[tuple[str, str], dict[str, Any]] = {}
    for s in sides:
        for f in s.families:
            families.setdefault(_family_key(f), {})[s.label] = {
                "slope_s_per_s": f.get("slope_s_per_s"),
                "overhead_100ms_pct": f.get("overhead_100ms_pct")}
    return {"kind": "sweeps",
            "sweeps": [{"label": s.label, "path": str(s.path), "name": s.settings.get("name"),
                        "backend": s.settings.get("backend")} for s in sides],
            "points": rows,
            "families": [{"semantics": k[0], "mode": k[1], "values": v}
                         for k, v in sorted(families.items())],
            "config_differences": config_differences(sides)}


def compare(sides: Sequence[Side]) -> dict[str, Any]:
    """:func:`run_table` or :func:`sweep_table`, as the sides are runs or sweeps."""
    return sweep_table(sides) if sides[0].kind == SWEEP else run_table(sides)

