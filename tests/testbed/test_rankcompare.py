"""``bench ranks``: two runs' per-rank timing side by side (pure, and from result dirs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed.results.rankcompare import compare, compare_dirs, rank_timing, run_timing


def _records(started: float, first_call: float, iterations: list[tuple[float, float]]
             ) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = [{"ev": "started", "t": started}]
    recs += [{"ev": "call", "t_intent": first_call + 0.5}, {"ev": "call", "t_intent": first_call}]
    recs += [{"ev": "iteration", "it": it, "t_start": a, "t_end": b}
             for it, (a, b) in enumerate(iterations)]
    return recs


def test_rank_timing_is_relative_to_time_zero() -> None:
    got = rank_timing(_records(102.0, 102.5, [(102.1, 103.0), (103.0, 104.5)]), 100.0)
    assert got["started_s"] == pytest.approx(2.0)
    assert got["first_call_s"] == pytest.approx(2.5)
    assert got["last_end_s"] == pytest.approx(4.5)
    assert got["iteration_s"] == pytest.approx([0.9, 1.5])


def test_a_rank_without_records_has_no_figures() -> None:
    assert rank_timing([], 0.0) == {"started_s": None, "first_call_s": None,
                                    "last_end_s": None, "iteration_s": [],
                                    "compute_overshoot_ms": None}


def test_spread_and_rank_by_rank_difference() -> None:
    a = run_timing({0: _records(1.0, 1.1, [(1.0, 2.0)]), 1: _records(3.0, 3.2, [(3.0, 4.0)])},
                   0.0)
    b = run_timing({0: _records(11.0, 11.1, [(11.0, 11.5)]),
                    1: _records(11.5, 11.6, [(11.5, 12.5)])}, 10.0)
    assert a["spread_s"]["started_s"] == pytest.approx(2.0)
    assert b["spread_s"]["started_s"] == pytest.approx(0.5)
    cmp = compare(a, b)
    row1 = cmp["ranks"][1]["b_minus_a"]
    assert row1["started_s"] == pytest.approx(-1.5)
    assert row1["iteration_s"] == pytest.approx([0.0])
    assert cmp["ranks"][0]["b_minus_a"]["iteration_s"] == pytest.approx([-0.5])
    assert cmp["median_b_minus_a_s"]["started_s"] == pytest.approx(-0.75)


def test_without_a_launch_record_time_zero_is_the_first_start() -> None:
    timing = run_timing({0: _records(5.0, 5.5, []), 1: _records(6.0, 6.5, [])}, None)
    assert timing["ranks"][0]["started_s"] == 0.0 and timing["ranks"][1]["started_s"] == 1.0


def _write_run(out: Path, processes: str, t_launch: float) -> None:
    (out / "ranks").mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"rank_processes": processes}))
    (out / "ranks" / "launch.json").write_text(json.dumps(
        {"t_start": t_launch, "t_end": t_launch + 0.2, "processes": 2}))
    for rank in range(2):
        recs = _records(t_launch + 1 + rank, t_launch + 1.5 + rank, [(t_launch + 2, t_launch + 3)])
        (out / "ranks" / f"rank{rank}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in recs))


def test_compare_dirs(tmp_path: Path) -> None:
    _write_run(tmp_path / "a", "rank", 100.0)
    _write_run(tmp_path / "b", "server", 200.0)
    got = compare_dirs(tmp_path / "a", tmp_path / "b")
    assert got["a"]["rank_processes"] == "rank" and got["b"]["rank_processes"] == "server"
    assert got["a"]["time_zero"] == "launch" and got["a"]["launch_s"] == pytest.approx(0.2)
    assert got["median_b_minus_a_s"]["last_end_s"] == pytest.approx(0.0)
    assert [r["rank"] for r in got["ranks"]] == [0, 1]
    with pytest.raises(FileNotFoundError, match="no ranks"):
        compare_dirs(tmp_path / "a", tmp_path / "missing")


def test_compute_overshoot_after_the_first_iteration() -> None:
    recs = [{"ev": "compute", "it": 0, "i": 0, "t_start": 0.0, "t_end": 9.0},  # start-up
            {"ev": "compute", "it": 1, "i": 0, "t_start": 10.0, "t_end": 10.102},
            {"ev": "compute", "it": 2, "i": 0, "t_start": 20.0, "t_end": 20.1005},
            {"ev": "compute", "it": 2, "i": 5, "t_start": 30.0, "t_end": 31.0}]  # not planned
    got = rank_timing(recs, 0.0, {0: 0.1})["compute_overshoot_ms"]
    # overshoots 2 and 0.5 ms: p50 is their mean (controller.stats), p90 0.9 of the way up
    assert got["n"] == 2 and got["max"] == pytest.approx(2.0)
    assert (got["p50"], got["p90"]) == pytest.approx((1.25, 1.85))
    assert rank_timing(recs, 0.0)["compute_overshoot_ms"] is None
    timing = run_timing({0: recs, 1: recs}, 0.0, {0: {0: 0.1}})
    assert timing["compute_overshoot_ms"]["n"] == 2  # rank 1's plan is unknown
