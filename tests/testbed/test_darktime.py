"""Dark periods of an emulated run against the configured delay: errors, early light, the app's
record against the configuration, missing switches, the bound overruns put on the figures."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from testbed.emulated.runner import _dark_check, expected_delay, rail_spec
from testbed.experiment.config import load_experiment
from testbed.experiment.faults import Fault
from testbed.metrics.darktime import (
    ITERATION_LIMIT_PCT,
    OVERHEAD_LIMIT_PCT,
    OVERRUN_REASON,
    ExpectedDelay,
    OverrunBound,
    check_dark_periods,
    dark_errors_ms,
    dark_text,
    dark_tolerance_ms,
    early_slack_ms,
    overrun_bound,
)
from testbed.metrics.fidelity import (
    CPU_PRESSURE_PCT,
    CpuSample,
    CpuSampler,
    RunEvidence,
    cpu_pressure_total_us,
    judge,
)
from testbed.results.summary import summary_text

ROOT = Path(__file__).resolve().parents[2]
QUIET = {"machine_cpu_mean_pct": 40.0, "machine_steal_mean_pct": 1.0}
SATURATED = {"machine_cpu_mean_pct": 97.0, "machine_steal_mean_pct": 1.0}
CONTENDED = QUIET | {"machine_cpu_pressure_pct": 95.0}


def switches(delay_ms: float, errors_ms: list[float], rail: int = 0, t0_s: float = 100.0,
             recorded_ms: float | None = None) -> list[dict[str, Any]]:
    """The OCS app's records of one switch per error, one second apart: dark (naming the delay
    it waited: ``recorded_ms``, else ``delay_ms``), then light ``delay + error`` later."""
    out: list[dict[str, Any]] = []
    for k, err in enumerate(errors_ms):
        t_dark = t0_s + k
        t_light = t_dark + (delay_ms + err) / 1e3
        out.append({"event": "dark", "rail": rail, "ports": [1, 2], "t_s": t_dark,
                    "delay_ms": delay_ms if recorded_ms is None else recorded_ms})
        out.append({"event": "light", "rail": rail, "added": [], "removed": [],
                    "t_request_s": t_dark - 1e-4, "t_dark_s": t_dark, "t_light_s": t_light,
                    "t_s": t_light})
    return out


def ends(n: int) -> list[dict[str, Any]]:
    """``n`` controller ``reconfig_end`` records that changed a circuit, and one that did not."""
    return [{"event": "reconfig_end", "rail": 0, "added": [[1, 2]], "removed": []}
            for _ in range(n)] + [{"event": "reconfig_end", "rail": 0, "added": [],
                                   "removed": []}]


def verdict(check: Any, cpu: dict[str, Any] = QUIET, bound: OverrunBound | None = None
            ) -> Any:
    return judge(RunEvidence(cpu, 10, 10, 0.9, 0.9, check, bound))


# ---------------------------------------------------------------- errors against the config

def test_errors_are_dark_period_minus_the_configured_delay() -> None:
    errors = dark_errors_ms(switches(100.0, [0.5, 1.0, 30.0, -3.0]), 100.0)
    assert errors == pytest.approx([0.5, 1.0, 30.0, -3.0], abs=1e-6)


def test_the_apps_record_is_not_the_reference() -> None:
    """An 80 ms switch on a 100 ms setting is 20 ms early, whatever the app says it waited."""
    records = switches(80.0, [0.0, 0.0])  # the app waited 80 ms and says so
    assert dark_errors_ms(records, 100.0) == pytest.approx([-20.0, -20.0], abs=1e-6)


@pytest.mark.parametrize(("name", "dark_ms", "recorded_ms", "early", "disagrees"), [
    ("doubled delay", 200.0, 200.0, False, True),
    ("delay 20 % short", 80.0, 80.0, True, True),
    ("early light", 95.0, 100.0, True, False),
])
def test_a_wrong_delay_or_early_light_degrades_and_blames_the_run(
        name: str, dark_ms: float, recorded_ms: float, early: bool, disagrees: bool) -> None:
    """On a quiet and on a busy machine alike: no load makes a switch wait another delay than
    the configured one, or light before it has passed."""
    check = check_dark_periods(switches(dark_ms, [0.0, 0.0, 0.0], recorded_ms=recorded_ms),
                               100.0, ends(3))
    assert (check.early() is not None, check.disagreements() is not None) == (early, disagrees)
    for cpu in (QUIET, SATURATED, CONTENDED):
        v = verdict(check, cpu)
        assert (v.fidelity, v.blame) == ("degraded", "run"), name
        assert any(r.blame == "run" for r in v.reasons)
    if disagrees:
        assert (f"the OCS app waited a delay the experiment did not configure on 3 of 3 "
                f"switches: {recorded_ms:g} ms on rail 0 against the configured 100 ms"
                in check.disagreements())  # type: ignore[operator]
    if early:
        assert f"3 of 3 switches lit early: dark {dark_ms:.2f} ms against the configured " \
               "100 ms (rail 0)" in check.early()  # type: ignore[operator]


def test_a_doubled_delay_is_caught_at_every_delay_the_tests_use() -> None:
    for delay_ms in (1.0, 5.0, 10.0, 20.0, 25.0, 100.0):
        check = check_dark_periods(switches(2 * delay_ms, [0.3]), delay_ms, ends(1))
        assert check.disagreements() is not None
        assert verdict(check, CONTENDED).blame == "run"


def test_early_light_allows_only_the_clocks_slack() -> None:
    assert early_slack_ms(0.0) == pytest.approx(0.2)
    assert early_slack_ms(100.0) == pytest.approx(0.25)
    within = check_dark_periods(switches(100.0, [-0.24]), 100.0, ends(1))
    beyond = check_dark_periods(switches(100.0, [-0.26]), 100.0, ends(1))
    assert within.early() is None and verdict(within).fidelity == "ok"
    assert beyond.early() is not None and verdict(beyond).blame == "run"
    zero = check_dark_periods(switches(0.0, [0.0]), 0.0, ends(1))  # a 0 ms delay: never early
    assert zero.early() is None and zero.disagreements() is None


def test_jitter_widens_the_configured_range() -> None:
    expected = ExpectedDelay(10.0, jitter_ms=5.0)
    assert expected.range_ms(0) == (5.0, 15.0)
    assert ExpectedDelay(3.0, jitter_ms=5.0).range_ms(0) == (0.0, 8.0)  # never below 0
    inside = [*switches(7.0, [0.2]), *switches(14.0, [0.5], t0_s=200.0)]
    check = check_dark_periods(inside, expected, ends(2))
    # inside the range: no error; past its top: the excess only
    assert [s.error_ms for s in check.switches] == pytest.approx([0.0, 0.0], abs=1e-6)
    assert check.early() is None and check.disagreements() is None
    late = check_dark_periods(switches(14.0, [2.0]), expected, ends(1))
    assert [s.error_ms for s in late.switches] == pytest.approx([1.0], abs=1e-6)
    outside = check_dark_periods(switches(16.0, [0.0]), expected, ends(1))
    assert outside.disagreements() is not None  # the app drew outside base +- jitter
    short = check_dark_periods(switches(4.0, [0.0]), expected, ends(1))
    assert short.early() is not None and short.disagreements() is not None
    assert "against the configured 10 +- 5 ms" in short.early()  # type: ignore[operator]


def test_per_rail_delays_are_each_rails_own() -> None:
    expected = ExpectedDelay(100.0, per_rail_ms={1: 50.0})
    events = [*switches(100.0, [0.5]), *switches(50.0, [0.5], rail=1, t0_s=200.0)]
    check = check_dark_periods(events, expected, [*ends(1), *[{**e, "rail": 1}
                                                              for e in ends(1)]])
    assert [s.error_ms for s in check.switches] == pytest.approx([0.5, 0.5], abs=1e-6)
    assert check.disagreements() is None and check.early() is None
    swapped = check_dark_periods(switches(100.0, [0.5], rail=1), expected, ends(1))
    assert swapped.disagreements() is not None  # rail 1 waited rail 0's delay


def test_statistics_are_linear_percentiles() -> None:
    check = check_dark_periods(switches(100.0, [0.5, 1.0, 30.0]), 100.0, ends(3))
    # numpy's linear percentiles of (0.5, 1, 30): p50 = 1, p99 = 1 + 0.98 * 29 = 29.42
    assert (check.count, check.p50_ms, check.p99_ms, check.max_ms) == pytest.approx(
        (3, 1.0, 29.42, 30.0), abs=1e-6)
    summary = check.to_summary()
    assert {k: summary[k] for k in ("count", "p50", "p99", "max", "min", "unfinished",
                                    "early", "record_disagrees")} == {
        "count": 3, "p50": check.p50_ms, "p99": check.p99_ms, "max": check.max_ms,
        "min": pytest.approx(0.5), "unfinished": 0, "early": 0, "record_disagrees": 0}
    assert summary["expected"] == {"base_ms": 100.0, "jitter_ms": 0.0, "per_rail_ms": {}}


def test_the_reference_tolerance_of_bench_fidelity_is_1_ms_or_5_percent() -> None:
    assert [dark_tolerance_ms(d) for d in (10, 25, 100)] == [1.0, 1.25, 5.0]


# ---------------------------------------------------------------- the bound on the figures

#: one warm-up iteration [100, 110) and two measured ones [110, 120), [120, 130)
WINDOWS = [(110.0, 120.0), (120.0, 130.0)]


def test_a_start_up_overrun_does_not_degrade_and_is_reported_on_its_own() -> None:
    """Switches before the measured iterations touch no figure: a 30 ms overrun there is
    reported, not judged."""
    events = [*switches(100.0, [30.0, 25.0], t0_s=100.0),  # warm-up: 100 s, 101 s
              *switches(100.0, [0.5, 0.4], t0_s=112.0)]  # measured: 112 s, 113 s
    check = check_dark_periods(events, 100.0, ends(4))
    bound = overrun_bound(check.switches, WINDOWS)
    assert bound.per_iteration_s == pytest.approx((0.0009, 0.0))
    assert bound.exceeded() is None
    assert verdict(check, bound=bound).fidelity == "ok"
    summary = check.to_summary(WINDOWS)
    assert (summary["measured"]["count"], summary["measured"]["max"]) == (2, pytest.approx(0.5))
    assert (summary["unmeasured"]["count"], summary["unmeasured"]["max"]) == (
        2, pytest.approx(30.0))
    text = dark_text(summary, bound.to_summary())
    assert "measured iterations: error p50 +0.45 ms" in text
    assert "start-up and warm-up (not judged): error p50 +27.50 ms" in text


def test_an_overrun_inside_the_measured_iterations_above_the_limit_degrades() -> None:
    """120 ms of late light in a 10 s iteration is 1.2 % of it (limit 1 %); where nothing
    waited on light it cannot have moved a figure."""
    events = switches(100.0, [60.0, 60.0], t0_s=112.0)  # 2 x 60 ms late in iteration 1
    check = check_dark_periods(events, 100.0, ends(2))
    bound = overrun_bound(check.switches, WINDOWS)
    assert bound.max_s == pytest.approx(0.12)
    assert bound.iteration_pct == pytest.approx(1.2)
    assert bound.late_switches == 2
    assert bound.exceeded() is not None and bound.exceeded().startswith(  # type: ignore[union-attr]
        OVERRUN_REASON)
    quiet = verdict(check, QUIET, bound)
    assert (quiet.fidelity, quiet.blame) == ("degraded", "run")
    assert "1.20 % of an iteration (limit 1 %)" in quiet.reasons[0].text
    assert "although the machine's CPU was neither saturated, stolen nor contended" in (
        quiet.reasons[0].text)
    busy = verdict(check, CONTENDED, bound)
    assert (busy.fidelity, busy.blame) == ("degraded", "machine")
    assert "some thread waited for a core 95 % of the run" in busy.reasons[0].text
    at_limit = verdict(check, CONTENDED | {"machine_cpu_pressure_pct": CPU_PRESSURE_PCT},
                       bound)
    assert at_limit.blame == "run"
    # nobody waited on light while it was late: no figure moved
    idle = overrun_bound(check.switches, WINDOWS, waiting=[(115.0, 116.0)])
    assert (idle.per_iteration_s, idle.exceeded()) == ((0.0, 0.0), None)


def test_the_bound_counts_wall_time_once_and_only_while_something_waited() -> None:
    """Two rails late at the same instants stretch an iteration once; the bound is also cut to
    the time some collective waited on light, and judged against that exposed time."""
    both = [*switches(100.0, [50.0]), *switches(100.0, [50.0], rail=1)]
    check = check_dark_periods(both, ExpectedDelay(100.0), ends(2))
    assert overrun_bound(check.switches, [(99.0, 110.0)]).per_iteration_s == pytest.approx(
        (0.05,))
    waited = overrun_bound(check.switches, [(99.0, 110.0)], waiting=[(100.0, 100.12)])
    assert waited.per_iteration_s == pytest.approx((0.02,))  # late 100.10-100.15, waited to .12
    assert waited.exposed_per_iteration_s == pytest.approx((0.12,))
    assert waited.overhead_pct == pytest.approx(100 * 0.02 / 0.12)
    assert waited.iteration_pct == pytest.approx(100 * 0.02 / 11.0)
    assert waited.exceeded() is not None and "16.7 % of the exposed switching (limit 5 %)" in (
        waited.exceeded())  # type: ignore[operator]


@pytest.mark.parametrize(("late_ms", "exposed_s", "degraded"), [
    (ITERATION_LIMIT_PCT * 100.0 - 1.0, 10.0, False),  # just under 1 % of a 10 s iteration
    (ITERATION_LIMIT_PCT * 100.0 + 1.0, 10.0, True),
    (OVERHEAD_LIMIT_PCT * 10.0 - 1.0, 1.0, False),  # just under 5 % of 1 s waited on light
    (OVERHEAD_LIMIT_PCT * 10.0 + 1.0, 1.0, True),
])
def test_the_limits_hold_on_either_side(late_ms: float, exposed_s: float,
                                              degraded: bool) -> None:
    sws = check_dark_periods(switches(100.0, [late_ms], t0_s=112.0), 100.0).switches
    bound = overrun_bound(sws, WINDOWS[:1], waiting=[(112.0, 112.0 + exposed_s)])
    assert (bound.exceeded() is not None) == degraded


def test_a_run_without_measured_iterations_or_waits_has_no_shares() -> None:
    sws = check_dark_periods(switches(100.0, [5.0]), 100.0).switches
    empty = overrun_bound(sws, [])
    assert (empty.max_s, empty.mean_s, empty.iteration_pct, empty.overhead_pct) == (
        None, None, None, None)
    assert empty.exceeded() is None
    assert overrun_bound(sws, WINDOWS, waiting=[]).overhead_pct is None


# ---------------------------------------------------------------- blame, CPU pressure

def test_an_overrun_blames_the_machine_only_when_busy() -> None:
    check = check_dark_periods(switches(100.0, [200.0], t0_s=112.0), 100.0, ends(1))
    bound = overrun_bound(check.switches, WINDOWS)
    assert verdict(check, QUIET, bound).blame == "run"
    assert [r.blame for r in verdict(check, SATURATED, bound).reasons] == ["machine", "machine"]
    # CPU pressure excuses only the dark periods: slow links on a quiet CPU stay the run's
    assert judge(RunEvidence(CONTENDED, 10, 10, 0.5)).blame == "run"


def test_cpu_pressure_is_read_from_psi_and_averaged_over_the_samples(tmp_path: Path) -> None:
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=98.63 avg60=98.69 avg300=94.12 total=3299169147\n"
                   "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert cpu_pressure_total_us(psi) == 3_299_169_147
    assert cpu_pressure_total_us(tmp_path / "missing") is None
    sampler = CpuSampler(pids=list)
    # 0.25 s of stall over 2 s of samples: 12.5 %
    sampler.samples += [CpuSample(10.0, 50.0, 0.0, 0.0, 1_000_000),
                        CpuSample(11.0, 50.0, 0.0, 0.0, 1_100_000),
                        CpuSample(12.0, 50.0, 0.0, 0.0, 1_250_000)]
    assert sampler.summary()["machine_cpu_pressure_pct"] == pytest.approx(12.5)
    sampler.samples[0].pressure_total_us = None  # no PSI on this kernel
    assert sampler.summary()["machine_cpu_pressure_pct"] is None


# ---------------------------------------------------------------- missing switches and logs

def test_missing_and_unfinished_switches_blame_the_run_even_on_a_busy_machine() -> None:
    events = switches(100.0, [0.5, 1.0])
    fewer = check_dark_periods(events, 100.0, ends(3))
    assert fewer.missing() == "the controller saw 3 switches end but the OCS app logged 2"
    unfinished = check_dark_periods(
        [*events, {"event": "dark", "rail": 1, "ports": [3], "t_s": 500.0}], 100.0, ends(2))
    assert unfinished.missing() == "1 switches went dark and never lit"
    for check in (fewer, unfinished):
        v = verdict(check, SATURATED)
        assert v.blame == "run" and v.reasons[-1].blame == "run"
    not_compared = check_dark_periods(events, 100.0, ends(3), counts_compared=False)
    assert not_compared.missing() is None  # e.g. through a Polatis front


def test_an_empty_ocs_log_on_a_polatis_run_that_reconfigured_blames_the_run() -> None:
    """Through a Polatis front the counts may differ, but a controller that switched while the
    app logged nothing is a missing log, not "no switches"."""
    empty = check_dark_periods([], 100.0, ends(4), counts_compared=False)
    assert empty.missing() == ("the controller reconfigured 4 times through the hardware "
                               "driver's front but the OCS app logged no dark period (its log "
                               "is empty)")
    missing = check_dark_periods([], 100.0, ends(4), counts_compared=False, log_found=False)
    assert "(its ocs-events.jsonl is missing)" in missing.missing()  # type: ignore[operator]
    for check in (empty, missing):
        for cpu in (QUIET, SATURATED):
            v = verdict(check, cpu)
            assert (v.fidelity, v.blame) == ("degraded", "run")
    idle = check_dark_periods([], 100.0, ends(0), counts_compared=False)
    assert idle.missing() is None  # nothing switched, nothing to log


def test_decisions_applied_in_one_switch_count_as_the_one_switch_the_app_logged() -> None:
    events = switches(100.0, [0.5, 0.7])  # the app: two switches of rail 0, at 100 s and 101 s
    batched = [{"event": "reconfig_end", "rail": 0, "added": [[1, 2]], "removed": [],
                "t_dark_s": t_dark} for t_dark in (100.0, 100.0, 100.0, 101.0)]
    check = check_dark_periods(events, 100.0, batched)
    assert (check.controller_switches, check.missing()) == (2, None)
    other_rail = [*batched, {**batched[0], "rail": 1}]  # same instant, another rail's switch
    assert check_dark_periods(events, 100.0, other_rail).controller_switches == 3


def test_no_switches_is_nothing_to_check() -> None:
    check = check_dark_periods([], 100.0, ends(0))
    assert (check.count, check.p50_ms, check.p99_ms, check.max_ms) == (0, None, None, None)
    assert check.run_faults() == []
    assert verdict(check, bound=overrun_bound(check.switches, WINDOWS)).fidelity == "ok"


def test_a_switch_lit_after_the_controllers_log_ended_is_not_compared() -> None:
    """A provisioning switch asked at the run's end lights after the controller stopped
    logging: the controller never saw it end, so the counts still agree; one lit before the
    log's end and missing from it is still a missing switch."""
    events = switches(100.0, [0.5, 1.0, 0.7])  # lit at ~100.1, ~101.1, ~102.1 s
    log = [{**e, "t_s": 101.5} for e in ends(2)]  # the controller's log ends at 101.5 s
    check = check_dark_periods(events, 100.0, log)
    assert (check.count, check.lit_after_log, check.missing()) == (3, 1, None)
    short = [{**e, "t_s": 101.5} for e in ends(1)]
    assert check_dark_periods(events, 100.0, short).missing() == (
        "the controller saw 1 switches end but the OCS app logged 2")


# ---------------------------------------------------------------- the runner's side

def _write_log(out: Path, events: list[dict[str, Any]] | None) -> None:
    (out / "emulator").mkdir(exist_ok=True)
    if events is not None:
        (out / "emulator" / "ocs-events.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in events))


def test_the_runner_judges_the_app_against_the_experiment(tmp_path: Path) -> None:
    cfg = load_experiment(ROOT / "examples" / "tiny.yaml")  # provisioning at 10 ms
    _write_log(tmp_path, switches(10.0, [0.3, 0.4]))
    check = _dark_check(tmp_path, cfg, ends(2))
    assert check is not None and check.count == 2 and check.delay_ms == 10.0
    assert check.run_faults() == []
    assert _dark_check(tmp_path, cfg.replace(mode="baseline"), []) is None
    # the app's log says 20 ms, the experiment 10 ms: the run is at fault
    _write_log(tmp_path, switches(20.0, [0.3, 0.4]))
    wrong = _dark_check(tmp_path, cfg, ends(2))
    assert wrong is not None and wrong.disagreements() is not None


def test_the_runner_reads_a_missing_log_on_a_polatis_run_as_missing(tmp_path: Path) -> None:
    cfg = load_experiment(ROOT / "examples" / "tiny.yaml").replace(driver="polatis-tl1")
    check = _dark_check(tmp_path, cfg, ends(5))
    assert check is not None and not check.counts_compared and not check.log_found
    assert "ocs-events.jsonl is missing" in (check.missing() or "")
    _write_log(tmp_path, [])
    empty = _dark_check(tmp_path, cfg, ends(5))
    assert empty is not None and "its log is empty" in (empty.missing() or "")
    _write_log(tmp_path, switches(10.0, [0.3, 0.4]))  # the front merged 5 requests into 2
    assert _dark_check(tmp_path, cfg, ends(5)).missing() is None  # type: ignore[union-attr]


def test_the_expected_delay_comes_from_the_experiment_and_its_fault_plan() -> None:
    cfg = load_experiment(ROOT / "examples" / "failover.yaml")  # 10 ms
    assert expected_delay(cfg) == ExpectedDelay(10.0)
    jittery = cfg.replace(mode="on-demand", faults=(
        Fault("jitter", 0, jitter_ms=4.0), Fault("jitter", 1, jitter_ms=2.0, at_iteration=1)))
    assert expected_delay(jittery) == ExpectedDelay(10.0, jitter_ms=4.0)
    spec = rail_spec(cfg, 2, 2, 8.0)  # two rails
    spec = dataclasses.replace(spec, per_rail_delay={1: "piezo"})
    assert expected_delay(cfg, spec).range_ms(1) == (25.0, 25.0)
    assert expected_delay(cfg, spec).range_ms(0) == (10.0, 10.0)


def _summary(backend: str, dark: dict[str, Any] | None,
             bound: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": "x", "mode": "on-demand", "switching_delay_ms": 100.0, "ports_per_rank": 1,
            "backend": backend, "iteration_time_s": 1.0, "iterations": 1, "warmup": 1,
            "iteration_times_s": [1.0], "reconfigurations": 3,
            "reconfigurations_per_iteration": 3.0, "exposed_reconfig_s": 0.1, "windows": 2,
            "windows_over_1ms_pct": 100.0, "window_median_s": 0.2, "calls_delivered": 4,
            "calls": 4, "bytes_received_scaled": 8, "bytes_expected_scaled": 8,
            "throughput_ratio_median": 0.9, "link_mbps": 8.0, "fidelity": "ok",
            "dark_error_ms": dark, "dark_overrun_bound": bound}


def test_the_summary_has_a_dark_periods_line_on_emulated_runs_only() -> None:
    check = check_dark_periods(switches(100.0, [0.5, 2.0, 4.0], t0_s=112.0), 100.0, ends(3))
    bound = overrun_bound(check.switches, WINDOWS, waiting=[(112.0, 115.0)])
    text = summary_text(_summary("emu", check.to_summary(WINDOWS), bound.to_summary()))
    assert ("dark periods        measured iterations: error p50 +2.00 ms, p99 +3.96 ms, max "
            "+4.00 ms over 3 switches; late light bounds an iteration's time by 6.5 ms (0.07 % "
            "of it, limit 1 %; 0.2 % of the exposed switching, limit 5 %)") in text
    assert text.index("dark periods") < text.index("fidelity")
    assert "dark periods" not in summary_text(_summary("sim", None))
    assert "no switches" in summary_text(_summary("emu", check_dark_periods(
        [], 100.0).to_summary(WINDOWS)))
