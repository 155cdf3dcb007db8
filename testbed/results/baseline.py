"""Figures derived from finished runs against their electrical baseline.

A run's summary holds its own figures; the overhead needs a second run, the baseline. It is
computed here once, for ``run --baseline``, the demo and the sweep alike: the overhead, the
bound late light puts on it (:func:`testbed.results.summary.judge_against_baseline`), the
baseline's verdict, and which of the runs the printed figures rest on
(:mod:`testbed.metrics.degraded`). :func:`rail_state_comparison` is the demo's comparison of
its rail-state overheads with the public artifact's run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.metrics.degraded import RESTS_ON, degraded_labels
from testbed.results.summary import judge_against_baseline, judge_call_costs


def overhead_pct(iteration_s: float | None, baseline_s: float | None) -> float | None:
    """Iteration time against the baseline's in percent; None without both (or a zero
    baseline)."""
    if iteration_s is None or not baseline_s:
        return None
    return 100.0 * (iteration_s - baseline_s) / baseline_s


def with_baseline(summary: dict[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Add to ``summary`` the baseline's iteration time and the overhead against it (and judge
    the bound late light puts on that overhead), the baseline's verdict
    (``baseline_fidelity``, ``_blame``, ``_reasons``), and ``rests_on_degraded``: which of the
    two runs (``baseline``, ``run``) the figures rest on are degraded. Returns ``summary``."""
    base = baseline.get("iteration_time_s")
    summary["baseline_iteration_time_s"] = base
    summary["overhead_pct"] = overhead_pct(summary.get("iteration_time_s"), base)
    judge_against_baseline(summary)
    judge_call_costs(summary, baseline)
    for key in ("fidelity", "fidelity_blame", "fidelity_reasons"):
        summary[f"baseline_{key}"] = baseline.get(key)
    summary[RESTS_ON] = degraded_labels([("baseline", baseline), ("run", summary)])
    return summary


def adopt_baseline_windows(run_dir: Path, baseline_dir: Path, summary: dict[str, Any]
                           ) -> dict[str, Any]:
    """Give a switched run the windows of its electrical baseline (paper §3.1: the gaps the
    workload offers; its own gaps hold its waits for light): ``windows.csv`` copied into
    ``run_dir``, the ``windows*`` figures with the share at least the run's switching delay,
    and ``windows_cdf.png`` drawn against that delay. Returns ``summary``."""
    from testbed.metrics.compute import window_figures
    from testbed.results import plots, store

    if not (baseline_dir / "windows.csv").exists():
        return summary
    rows = store.read_csv(baseline_dir / "windows.csv")
    store.write_csv(run_dir / "windows.csv", rows)
    delay_ms = summary.get("switching_delay_ms")
    summary.update(window_figures(rows, delay_ms=delay_ms))
    plots.window_cdf(rows, run_dir / "windows_cdf.png",
                     f"{summary.get('name', run_dir.name)}: windows of the electrical "
                     "baseline (paper §3.1)", delay_ms=delay_ms)
    return summary


def against_baseline(runs: Mapping[str, dict[str, Any]], baseline_label: str
                     ) -> Mapping[str, dict[str, Any]]:
    """Every run of ``runs`` (label -> summary) with its overhead against the run labelled
    ``baseline_label`` (none when that run is missing). Returns ``runs``."""
    base = runs.get(baseline_label, {})
    for summary in runs.values():
        with_baseline(summary, base)
    return runs


def _pct(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def overhead_text(summary: Mapping[str, Any] | None) -> str:
    """A summary's overhead as printed: ``+1.2 %``, or ``n/a``."""
    ov = None if summary is None else summary.get("overhead_pct")
    return "n/a" if ov is None else f"{ov:+.1f} %"


def rail_state_comparison(ours: Mapping[str, Mapping[str, Any]],
                          artifact: Mapping[str, Mapping[str, Any]], labels: Sequence[str],
                          baseline_label: str) -> str:
    """Our step and the overheads of the runs ``labels`` against the artifact's runs of the
    same labels (both judged by :func:`against_baseline`), saying "larger" or "smaller" only
    where every overhead compared is, and "so" (a shorter step makes the same exposed
    switching a larger share) only for a shorter step with larger overheads."""
    base = ours.get(baseline_label, {}).get("iteration_time_s")
    artifact_base = artifact.get(baseline_label, {}).get("iteration_time_s")
    text = f"this demo's step is {_pct(base, '.2f')} s"
    pairs = [(ours.get(x, {}).get("overhead_pct"), artifact.get(x, {}).get("overhead_pct"))
             for x in labels]
    compared = [(d, a) for d, a in pairs if d is not None and a is not None]
    figures = " / ".join(overhead_text(ours.get(x)) for x in labels)
    if not compared:
        return text
    if all(d > a for d, a in compared):
        shorter = base is not None and artifact_base is not None and base < artifact_base
        return f"{text}{', so' if shorter else ';'} its rail-state overheads are larger, {figures}"
    if all(d < a for d, a in compared):
        return f"{text}; its rail-state overheads are smaller, {figures}"
    return f"{text}; its rail-state overheads are {figures}"
