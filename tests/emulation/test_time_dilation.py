"""Time dilation's invariance (issue 35): examples/tiny.yaml at k = 1 and k = 2, model time.

The same experiment, its electrical baseline and its provisioning run, at time dilation 1 and
2 must give the same model-time figures: the reconfigurations per iteration (within the
movement that tie-breaking and the per-call costs give, :data:`RECONFIGURATIONS_SLACK`), and
the iteration
time within 2 % and the overhead within 1.5 points once the part the testbed's own costs
explain is set aside (each run's measured per-call bound, which halves from k = 1 to k = 2,
and its late-light bound: ``docs/validation.md``, "Time dilation"). The timing figures are
asserted where the machine was not to blame for either run (a saturated CPU stretches every
wall-clock wait, which no factor undoes); what holds under any load is asserted always.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testbed.emulated.runner import run_emulated
from testbed.experiment.config import load_experiment
from testbed.experiment.prepare import prepare
from testbed.results.baseline import with_baseline

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"
ITERATION_PCT = 2.0
OVERHEAD_PTS = 1.5
#: The reconfigurations per iteration are not invariant (docs/validation.md, 11.3): ties
#: between simultaneous requests are broken by costs the model has not, and the per-call costs
#: bias the count low at small k (tiny.yaml, loaded machine: 10.7-11.7 at k = 1, 11.0-13.3 at
#: k = 2; the simulator 12-14 under the emulator's costs, 13.5-14 with them / 1000). The test
#: bounds the movement; equality is the open target.
RECONFIGURATIONS_SLACK = 3.0


def _run(tmp_path: Path, k: float, no_leftovers: list[str],
         gate: Callable[..., None]) -> tuple[dict[str, Any], dict[str, Any]]:
    # the wire check has its own tests (test_wire_check.py, at k = 1); here it would add its
    # capture's CPU to the runs being compared
    cfg = load_experiment(TINY).replace(time_dilation=k, iterations=3, wire_check=False)
    runs = {}
    for mode in ("baseline", "provisioning"):
        out = tmp_path / f"k{k:g}-{mode}"
        runs[mode] = run_emulated(prepare(cfg.replace(mode=mode)), out, say=lambda _m: None)
        no_leftovers.append(str(json.loads((out / "manifest.json").read_text())["prefix"]))
        gate(runs[mode], out, delay_ms=cfg.replace(mode=mode).switching_delay_ms)
        assert runs[mode]["time_dilation"] == k
        assert abs(runs[mode]["model_s"] * k - runs[mode]["wall_s"]) < 1e-6
    return runs["baseline"], with_baseline(runs["provisioning"], runs["baseline"])


def _explained(s: dict[str, Any]) -> float:
    """What the testbed's own costs may have put on a run's mean iteration (s)."""
    late = (s.get("dark_overrun_bound") or {}).get("mean_s") or 0.0
    return float(s["call_cost_bound"]["per_iteration_s"]) + float(late)


@pytest.mark.xfail(strict=False, reason=(
    "issue 35 is open: in 3 of 11 runs one run's figure moved beyond the bounds; in the one "
    "examined (CI, 2026-12-07) a pipeline send at k = 2 took 1.0 s of wall time, a lost TCP SYN "
    "retransmitted after Linux's 1 s initial timeout, which does not dilate and which the "
    "verdict does not yet see (docs/validation.md 11.3)"))
def test_model_time_figures_do_not_depend_on_the_factor(
        tmp_path: Path, no_leftovers: list[str], fidelity_gate: Callable[..., None]) -> None:
    base1, run1 = _run(tmp_path, 1.0, no_leftovers, fidelity_gate)
    base2, run2 = _run(tmp_path, 2.0, no_leftovers, fidelity_gate)
    assert abs(run1["reconfigurations_per_iteration"]
               - run2["reconfigurations_per_iteration"]) <= RECONFIGURATIONS_SLACK
    assert run2["dark_error_wall_ms"]["p50"] == 2 * run2["dark_error_ms"]["p50"]
    # the per-call costs are fixed on the wall: in model time they shrink with k
    assert run2["call_cost_bound"]["per_iteration_s"] < run1["call_cost_bound"][
        "per_iteration_s"]
    # each run's own costs lie between 0 and its bound (a bound, not the cost): two runs of one
    # model-time figure can differ by the larger of their bounds, plus the tolerance
    for one, two in ((base1, base2), (run1, run2)):
        gap_s = abs(one["iteration_time_s"] - two["iteration_time_s"])
        allowed_s = (ITERATION_PCT / 100 * two["iteration_time_s"]
                     + max(_explained(one), _explained(two)))
        assert gap_s <= allowed_s, (one["mode"], one["iteration_time_s"],
                                    two["iteration_time_s"], allowed_s)
    explained_pts = 100 * (max(_explained(run1), _explained(run2))
                           + max(_explained(base1), _explained(base2))) / base2[
        "iteration_time_s"]
    assert abs(run1["overhead_pct"] - run2["overhead_pct"]) <= OVERHEAD_PTS + explained_pts
