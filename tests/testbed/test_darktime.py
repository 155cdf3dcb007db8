"""Dark periods of an emulated run against the injected delay: statistics, verdicts, summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed.emulated.runner import _dark_check
from testbed.experiment.config import load_experiment
from testbed.metrics.darktime import (
    check_dark_periods,
    dark_errors_ms,
    dark_tolerance_ms,
)
from testbed.metrics.fidelity import (
    CPU_PRESSURE_PCT,
    CpuSample,
    CpuSampler,
    cpu_pressure_total_us,
    judge,
)
from testbed.results.summary import summary_text

ROOT = Path(__file__).resolve().parents[2]
QUIET = {"machine_cpu_mean_pct": 40.0, "machine_steal_mean_pct": 1.0}
SATURATED = {"machine_cpu_mean_pct": 97.0, "machine_steal_mean_pct": 1.0}


def switches(delay_ms: float, errors_ms: list[float], rail: int = 0) -> list[dict[str, Any]]:
    """The OCS app's records of one switch per error: dark, then light ``delay + error`` later."""
    out: list[dict[str, Any]] = []
    for k, err in enumerate(errors_ms):
        t_dark = 100.0 + k
        t_light = t_dark + (delay_ms + err) / 1e3
        out.append({"event": "dark", "rail": rail, "ports": [1, 2], "t_s": t_dark})
        out.append({"event": "light", "rail": rail, "added": [], "removed": [],
                    "t_request_s": t_dark - 1e-4, "t_dark_s": t_dark, "t_light_s": t_light,
                    "t_s": t_light})
    return out


def ends(n: int) -> list[dict[str, Any]]:
    """``n`` controller ``reconfig_end`` records that changed a circuit, and one that did not."""
    return [{"event": "reconfig_end", "rail": 0, "added": [[1, 2]], "removed": []}
            for _ in range(n)] + [{"event": "reconfig_end", "rail": 0, "added": [],
                                   "removed": []}]


def test_errors_are_dark_period_minus_delay() -> None:
    errors = dark_errors_ms(switches(100.0, [0.5, 1.0, 30.0]), 100.0)
    assert errors == pytest.approx([0.5, 1.0, 30.0], abs=1e-6)


def test_a_switch_that_names_its_injected_delay_is_judged_against_it() -> None:
    """Jitter (fault injection) draws each switch's delay: the dark record names it."""
    records = switches(100.0, [0.5, -20.0])
    records[2]["delay_ms"] = 80.0  # the second switch was injected 80 ms: 0.0 ms late
    assert dark_errors_ms(records, 100.0) == pytest.approx([0.5, 0.0], abs=1e-6)


def test_statistics_are_linear_percentiles() -> None:
    check = check_dark_periods(switches(100.0, [0.5, 1.0, 30.0]), 100.0, ends(3))
    # numpy's linear percentiles of (0.5, 1, 30): p50 = 1, p99 = 1 + 0.98 * 29 = 29.42
    assert (check.count, check.p50_ms, check.p99_ms, check.max_ms) == pytest.approx(
        (3, 1.0, 29.42, 30.0), abs=1e-6)
    assert check.to_summary() == {"count": 3, "p50": check.p50_ms, "p99": check.p99_ms,
                                  "max": check.max_ms, "tolerance": 5.0, "unfinished": 0}


@pytest.mark.parametrize(("delay_ms", "tolerance_ms"), [(10, 1.0), (20, 1.0), (25, 1.25),
                                                        (100, 5.0), (250, 12.5)])
def test_tolerance_is_1_ms_or_5_percent(delay_ms: float, tolerance_ms: float) -> None:
    assert dark_tolerance_ms(delay_ms) == tolerance_ms


@pytest.mark.parametrize(("delay_ms", "errors", "overrun"), [
    (100.0, [0.5, 1.0, 30.0], True),  # p99 29.4 ms > 5 ms
    (100.0, [0.5, 2.0, 4.0], False),  # p99 3.96 ms
    (10.0, [0.2, 0.4, 1.5], True),  # p99 1.48 ms > 1 ms
    (10.0, [0.2, 0.4, 0.9], False),
])
def test_overrun_is_judged_on_the_p99(delay_ms: float, errors: list[float],
                                      overrun: bool) -> None:
    check = check_dark_periods(switches(delay_ms, errors), delay_ms, ends(len(errors)))
    assert (check.overrun() is not None) == overrun
    assert check.missing() is None


def test_an_overrun_blames_the_run_on_a_quiet_machine_and_the_machine_when_busy() -> None:
    check = check_dark_periods(switches(100.0, [0.5, 1.0, 30.0]), 100.0, ends(3))
    quiet = judge(QUIET, 0.9, 10, 10, check)
    assert (quiet.fidelity, quiet.blame) == ("degraded", "run")
    assert "error p99 29.42 ms (max 30.00 ms) over 3 switches, tolerance 5.00 ms" in (
        quiet.reasons[0].text)
    busy = judge(SATURATED, 0.9, 10, 10, check)
    assert [r.blame for r in busy.reasons] == ["machine", "machine"]
    # threads waited for a core: the OCS app's helpers and Open vSwitch among them
    contended = judge(QUIET | {"machine_cpu_pressure_pct": CPU_PRESSURE_PCT + 1}, 0.9, 10, 10,
                      check)
    assert [r.blame for r in contended.reasons] == ["machine"]
    assert "some thread waited for a core 11 % of the run" in contended.reasons[0].text
    calm = judge(QUIET | {"machine_cpu_pressure_pct": CPU_PRESSURE_PCT}, 0.9, 10, 10, check)
    assert calm.blame == "run"
    # CPU pressure excuses only the dark periods: slow links on a quiet CPU stay the run's
    assert judge(QUIET | {"machine_cpu_pressure_pct": 90.0}, 0.5, 10, 10).blame == "run"
    assert judge(QUIET, 0.9, 10, 10, check_dark_periods(
        switches(100.0, [0.5, 2.0]), 100.0, ends(2))).fidelity == "ok"


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


def test_missing_and_unfinished_switches_blame_the_run_even_on_a_busy_machine() -> None:
    events = switches(100.0, [0.5, 1.0])
    fewer = check_dark_periods(events, 100.0, ends(3))
    assert fewer.missing() == "the controller saw 3 switches end but the OCS app logged 2"
    unfinished = check_dark_periods(
        [*events, {"event": "dark", "rail": 1, "ports": [3], "t_s": 500.0}], 100.0, ends(2))
    assert unfinished.missing() == "1 switches went dark and never lit"
    for check in (fewer, unfinished):
        v = judge(SATURATED, 0.9, 10, 10, check)
        assert v.blame == "run" and v.reasons[-1].blame == "run"
    not_compared = check_dark_periods(events, 100.0, None)  # e.g. through a Polatis front
    assert not_compared.missing() is None


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
    assert check.overrun() is None and check.missing() is None
    assert judge(QUIET, 0.9, 10, 10, check).fidelity == "ok"


def test_the_runner_reads_the_ocs_apps_log_and_skips_the_baseline(tmp_path: Path) -> None:
    cfg = load_experiment(ROOT / "examples" / "tiny.yaml")  # provisioning at 10 ms
    (tmp_path / "emulator").mkdir()
    (tmp_path / "emulator" / "ocs-events.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in switches(10.0, [0.3, 0.4])))
    check = _dark_check(tmp_path, cfg, ends(2))
    assert check is not None and check.count == 2 and check.delay_ms == 10.0
    assert check.overrun() is None and check.missing() is None
    assert _dark_check(tmp_path, cfg.replace(mode="baseline"), []) is None
    polatis = cfg.replace(driver="polatis-tl1")
    assert _dark_check(tmp_path, polatis, ends(5)).controller_switches is None  # type: ignore[union-attr]


def _summary(backend: str, dark: dict[str, Any] | None) -> dict[str, Any]:
    return {"name": "x", "mode": "on-demand", "switching_delay_ms": 100.0, "ports_per_rank": 1,
            "backend": backend, "iteration_time_s": 1.0, "iterations": 1, "warmup": 1,
            "iteration_times_s": [1.0], "reconfigurations": 3,
            "reconfigurations_per_iteration": 3.0, "exposed_reconfig_s": 0.1, "windows": 2,
            "windows_over_1ms_pct": 100.0, "window_median_s": 0.2, "calls_delivered": 4,
            "calls": 4, "bytes_received_scaled": 8, "bytes_expected_scaled": 8,
            "throughput_ratio_median": 0.9, "link_mbps": 8.0, "fidelity": "ok",
            "dark_error_ms": dark}


def test_the_summary_has_a_dark_periods_line_on_emulated_runs_only() -> None:
    dark = check_dark_periods(switches(100.0, [0.5, 2.0, 4.0]), 100.0, ends(3)).to_summary()
    text = summary_text(_summary("emu", dark))
    assert ("dark periods        error p50 +2.00 ms, p99 +3.96 ms, max +4.00 ms over 3 "
            "switches (tolerance 5.00 ms)") in text
    assert text.index("dark periods") < text.index("fidelity")
    assert "dark periods" not in summary_text(_summary("sim", None))


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
