"""What ``sweep`` prints and plots about what it measured (fabricated rows, no runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from testbed.cli.experiments import sweep_lines
from testbed.experiment.config import DEFAULT_SWEEP_DELAYS
from testbed.metrics.fit import fit_families
from testbed.results.plots import sweep_figure, sweep_title
from testbed.results.reference import artifact_reference, matches_artifact
from testbed.studies.sweep import point_label, sweep_points


def _rows(delays_ms: list[float], fail: frozenset[float] = frozenset()) -> list[dict[str, Any]]:
    """A sweep of one on-demand family: 1 s baseline, +2 s per second of delay."""
    rows = []
    for sem, mode, d in sweep_points(["on-demand"], delays_ms):
        t = None if d in fail else 1.0 + 2.0 * d / 1e3
        rows.append({"mode": mode, "semantics": sem, "delay_ms": d, "iteration_time_s": t,
                     "overhead_pct": None if t is None else 100 * (t - 1.0),
                     "exposed_reconfig_s": None, "error": "boom" if d in fail else "",
                     "point": point_label((sem, mode, d)), "fidelity": "simulated",
                     "rests_on_degraded": []})
    return rows


def _lines(rows: list[dict[str, Any]]) -> list[str]:
    return sweep_lines(rows, {"families": fit_families(rows)})


def test_the_default_grid_gives_a_slope() -> None:
    delays = [float(d) for d in DEFAULT_SWEEP_DELAYS.split(",")]
    lines = _lines(_rows(delays))
    assert "on-demand, port-exact: slope 2.00 s/s (>= 250 ms), overhead at 100 ms +20.0 %" \
        in lines


def test_a_grid_without_two_long_delays_says_why_and_what_to_add() -> None:
    lines = _lines(_rows([0, 1, 10, 100]))
    assert ("on-demand, port-exact: slope n/a (needs 2 delays >= 250 ms, where exposed "
            "switching dominates; this sweep has none (its largest is 100 ms): add --delays "
            "...,250,500), overhead at 100 ms +20.0 %") in lines
    assert "this sweep has one, 250 ms: add --delays" in _lines(_rows([0, 10, 250]))[-1]
    lines = _lines(_rows([0, 250, 500], fail=frozenset({500.0})))
    assert "only 1 of its 2 succeeded" in lines[-1]
    assert "overhead at 100 ms n/a (no measured 100 ms point with a baseline)" in lines[-1]


def test_0_ms_is_shown_as_the_baseline() -> None:
    lines = _lines(_rows([0, 10, 250, 500]))
    assert lines[1].split()[:2] == ["baseline", "0"]
    assert "0 ms is the baseline: electrical rails, no OCS; each overhead_% is against it" \
        in lines
    assert [p for p in sweep_points(["on-demand"], [0, 10]) if p[2] == 0] == [
        ("", "baseline", 0.0)]


# --- the plot (iteration_vs_delay.png) -------------------------------------------------------

def _figure(rows: list[dict[str, Any]], reference: dict[str, Any] | None = None) -> Any:
    delays = sorted({float(r["delay_ms"]) for r in rows})
    title = sweep_title("tiny", "sim", ["port-exact"], ["baseline", "on-demand"], delays)
    return sweep_figure(rows, title, fit_families(rows), reference)


def _overlaps(a: Any, b: Any) -> bool:
    return bool(a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1)


def test_the_plot_scales_to_the_users_data_without_the_artifact() -> None:
    rows = _rows([0, 1, 10, 25, 50, 100])
    fig = _figure(rows)
    try:
        left, right = fig.axes
        lo, hi = left.get_ylim()
        assert 0.9 <= lo < 1.0 and 1.2 < hi < 1.3  # 1.0 s .. 1.2 s, no 27 s artifact point
        assert left.get_xlim()[0] < 0 < 1 and 100 < left.get_xlim()[1] < 200
        assert left.get_xscale() == "symlog"  # 1..100 ms: 0, 1, 10 and 100 all readable
        assert [float(t) for t in left.get_xticks()] == [0, 1, 10, 25, 50, 100]
        assert right.get_ylim()[0] < 0 < 20 < right.get_ylim()[1] < 40  # 0 % .. +20 %
        title = fig._suptitle.get_text()
        assert "sim backend, port-exact; on-demand at 1-100 ms; 0 ms = electrical baseline" \
            in title
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert labels[0].startswith("baseline: electrical rails, 0 ms")
        assert not any("artifact" in t for t in labels)
        fig.canvas.draw()
        box = fig.legends[0].get_window_extent()
        for ax in fig.axes:  # the legend covers no panel, nor its x label
            assert not _overlaps(box, ax.get_tightbbox())
    finally:
        plt.close(fig)


def test_the_plot_rings_degraded_points_and_draws_the_reference_when_given() -> None:
    rows = _rows([0, 10, 100, 250, 500])
    rows[2]["fidelity"] = "degraded"
    fig = _figure(rows, artifact_reference())
    try:
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert "degraded run (reasons: sweep output)" in labels
        assert "on-demand, port-exact (slope 2.00 s/s)" in labels
        assert any(t.startswith("on-demand, artifact") for t in labels)
        assert fig.axes[0].get_ylim()[1] > 27  # the artifact's 3000 ms point is on the axes
    finally:
        plt.close(fig)


def test_the_reference_is_drawn_only_for_the_artifacts_workload() -> None:
    from testbed.experiment.config import load_experiment

    examples = Path(__file__).resolve().parents[2] / "examples"
    assert matches_artifact(load_experiment(examples / "llama3-8b-artifact.yaml").workload)
    assert matches_artifact(load_experiment(
        examples / "llama3-8b-artifact-scaled.yaml").workload)
    assert not matches_artifact(load_experiment(examples / "tiny.yaml").workload)
