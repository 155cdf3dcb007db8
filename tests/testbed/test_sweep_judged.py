"""A sweep judges each emulated point's overhead against its baseline as run --baseline does."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.studies.sweep import judge_overheads


def _summary(it_s: float, late_mean_s: float) -> dict[str, object]:
    return {"iteration_time_s": it_s, "fidelity": "ok", "fidelity_blame": "none",
            "fidelity_reasons": [], "fidelity_causes": [], "fidelity_unrated": [], "cpu": {},
            "dark_overrun_bound": {"mean_s": late_mean_s, "max_s": late_mean_s}}


def test_late_light_past_5_percent_of_the_overhead_degrades_the_point_and_its_file(
        tmp_path: Path) -> None:
    points = [("port-exact", "baseline", 0.0), ("port-exact", "on-demand", 100.0),
              ("port-exact", "provisioning", 100.0)]
    summaries = [_summary(1.0, 0.0), _summary(1.2, 0.02), _summary(1.2, 0.005)]
    dirs = [tmp_path / n for n in ("b", "od", "pv")]
    for d, s in zip(dirs, summaries, strict=True):
        d.mkdir()
        (d / "summary.json").write_text(json.dumps(s))
    judge_overheads(points, summaries, dirs)
    # 20 ms of late light in a 200 ms overhead: 10 % > 5 %; 5 ms: 2.5 %
    assert [s["fidelity"] for s in summaries] == ["ok", "degraded", "ok"]
    assert json.loads((dirs[1] / "summary.json").read_text())["fidelity"] == "degraded"
    assert json.loads((dirs[2] / "summary.json").read_text())["fidelity"] == "ok"
    assert "overhead against the baseline" in summaries[1]["fidelity_reasons"][0]
