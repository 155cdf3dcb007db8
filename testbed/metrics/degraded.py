"""Which printed figures rest on a degraded run: the one rule, and how it is shown (pure).

A run is *degraded* when its summary's ``fidelity`` is ``"degraded"``
(:mod:`testbed.metrics.fidelity` decides that); a simulated run (``"simulated"``) is never
degraded, nor is a point that failed before it had a verdict. A figure *rests on* every run it
is computed from: an overhead on its run and the baseline, a slope on every point fitted, a
cross-validation ratio on its emulated run. Commands that print such figures (``run
--baseline``, ``sweep``, ``ladder``, ``bench crossval``) list those runs under
``rests_on_degraded`` in their JSON (and CSV), mark the printed figure with :data:`MARK`, print
a legend naming each run's reasons (:func:`legend`), and exit with :data:`EXIT_DEGRADED`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: Exit status of a command whose printed figures rest on a degraded run.
EXIT_DEGRADED = 3
#: Marker after a printed figure that rests on a degraded run.
MARK = "*"
#: The summary key (and JSON/CSV field) listing the degraded runs a figure rests on.
RESTS_ON = "rests_on_degraded"


def is_degraded(summary: Mapping[str, Any] | None) -> bool:
    """True when the run's fidelity verdict is ``degraded`` (the only rule; see the module
    docstring). ``summary`` may be a run's summary or a sweep row (both carry ``fidelity``)."""
    return summary is not None and summary.get("fidelity") == "degraded"


def degraded_labels(runs: Iterable[tuple[str, Mapping[str, Any] | None]]) -> list[str]:
    """The labels of the degraded runs among ``(label, summary)`` pairs, first seen first,
    each once."""
    return list(dict.fromkeys(label for label, summary in runs if is_degraded(summary)))


def as_list(value: Any) -> list[str]:
    """A ``rests_on_degraded`` value as a list: a list as it is, a CSV cell (labels joined by
    ``"; "``) split, nothing as ``[]``."""
    if value in (None, ""):
        return []
    if isinstance(value, str):
        return [v for v in value.split("; ") if v]
    return [str(v) for v in value]


def csv_cell(labels: Iterable[str]) -> str:
    """``rests_on_degraded`` (or ``fidelity_reasons``) as one CSV cell: joined by ``"; "``."""
    return "; ".join(labels)


def union(*labels: Iterable[str]) -> list[str]:
    """Several ``rests_on_degraded`` lists as one, first seen first, each label once."""
    return list(dict.fromkeys(label for group in labels for label in group))


def mark(text: str, rests_on: Iterable[str]) -> str:
    """``text`` with :data:`MARK` appended when ``rests_on`` names any run."""
    return text + MARK if any(True for _ in rests_on) else text


def reasons_text(summary: Mapping[str, Any]) -> str:
    """``blamed on the machine: reason; reason`` from a summary or a sweep row (whose
    ``fidelity_reasons`` may be a list or a ``; ``-joined string, as in a CSV)."""
    reasons = as_list(summary.get("fidelity_reasons"))
    blame = summary.get("fidelity_blame") or "run"
    return f"blamed on the {blame}" + (": " + "; ".join(reasons) if reasons else "")


def verdict(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A run's verdict as ``degraded_runs`` keeps it: fidelity, blame and reasons."""
    return {"fidelity": summary.get("fidelity"), "fidelity_blame": summary.get("fidelity_blame"),
            "fidelity_reasons": as_list(summary.get("fidelity_reasons"))}


def degraded_runs(runs: Iterable[tuple[str, Mapping[str, Any] | None]]
                  ) -> dict[str, dict[str, Any]]:
    """label -> :func:`verdict` of each degraded run among ``(label, summary)`` pairs: what a
    JSON result keeps so that its legend can name the reasons."""
    return {label: verdict(s) for label, s in runs if s is not None and is_degraded(s)}


def legend(runs: Iterable[tuple[str, Mapping[str, Any] | None]]) -> list[str]:
    """The lines under a table whose marked figures rest on degraded runs: one per degraded
    run among ``(label, summary)`` pairs with its blame and reasons, then the exit status.
    Empty when no run is degraded."""
    seen = degraded_runs(runs)
    if not seen:
        return []
    return [f"{MARK} rests on a degraded run: kept, but not to be trusted alone "
            "(README, Fidelity):",
            *(f"  {label}: degraded ({reasons_text(s)})" for label, s in seen.items()),
            f"exit status {EXIT_DEGRADED}: printed figures rest on {len(seen)} degraded "
            f"run{'s' * (len(seen) != 1)}"]


def exit_status(rests_on: Iterable[str]) -> int:
    """:data:`EXIT_DEGRADED` when any printed figure rests on a degraded run, else 0."""
    return EXIT_DEGRADED if any(True for _ in rests_on) else 0
