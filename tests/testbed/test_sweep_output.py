"""What ``sweep`` prints about what it measured (pure: fabricated rows, no runs)."""

from __future__ import annotations

from typing import Any

from testbed.cli.experiments import sweep_lines
from testbed.experiment.sweep import DEFAULT_SWEEP_DELAYS, point_label, sweep_points
from testbed.metrics.fit import fit_families


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
            "switching dominates; this sweep has 0, largest 100 ms: add --delays ...,250,500)"
            ", overhead at 100 ms +20.0 %") in lines
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
