"""A machine verdict rests on evidence (issue 36, item 0): the CPU rules judge only from samples
inside the measured iterations, and enough of them; the breakdown by component and the machine
figure come from the same samples, and their difference is named."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from testbed.metrics.fidelity import (
    CPU_INTERVAL_MAX_S,
    CPU_INTERVAL_MIN_S,
    CPU_SATURATED_PCT,
    MIN_CPU_SAMPLES,
    CpuSample,
    CpuSampler,
    RunEvidence,
    cpu_interval_s,
    judge,
)

PARTS = {"controller": 0.0, "ocs-app": 0.0, "ovs-vswitchd": 0.0, "ranks": 0.0}


def _sampler(*samples: CpuSample) -> CpuSampler:
    sampler = CpuSampler(pids=list, interval_s=0.1)
    sampler.samples += samples
    return sampler


def _sample(t0: float, t1: float, machine: float, parts: dict[str, float] | None = None,
            complete: bool = True) -> CpuSample:
    return CpuSample(t1, machine, sum((parts or {}).values()), 0.0, None, dict(parts or {}),
                     t0, complete)


def test_the_issues_run_one_start_up_sample_is_unrated_not_saturated() -> None:
    """What issue 36 saw on tiny.yaml: one 0.5 s sample, taken while the ranks started (the
    machine 100 % busy, every component 0.0 at its first read), before measured iterations of
    0.19 s. That sample is not inside them: the CPU is unrated and the run not saturated."""
    window = (10.6, 10.79)  # the measured iterations
    cpu = _sampler(_sample(10.0, 10.5, 100.0, PARTS, complete=False)).summary(window)
    assert cpu["rated"] is False and "machine_cpu_mean_pct" not in cpu
    assert cpu["samples"] == 0 and cpu["samples_taken"] == 1
    assert "0 sample(s)" in cpu["unrated"] and "run more iterations" in cpu["unrated"]
    verdict = judge(RunEvidence(cpu, 10, 10, 0.9, 0.9))
    assert verdict.fidelity == "ok" and not verdict.reasons
    assert any(u.startswith("cpu: ") for u in verdict.unrated)


@pytest.mark.parametrize("inside", range(MIN_CPU_SAMPLES + 1))
def test_saturated_needs_enough_samples_inside_the_measured_iterations(inside: int) -> None:
    """Busy samples at 100 %: fewer than MIN_CPU_SAMPLES inside the window leave the CPU
    unrated; from MIN_CPU_SAMPLES on (covering the window) the run is saturated."""
    samples = [_sample(20.0 + 0.1 * i, 20.1 + 0.1 * i, 100.0) for i in range(inside)]
    cpu = _sampler(*samples).summary((20.0, 20.0 + 0.1 * max(inside, 1)))
    saturated = any("saturated" in r.text for r in judge(RunEvidence(cpu)).reasons)
    assert cpu["rated"] is (inside >= MIN_CPU_SAMPLES)
    assert saturated is (inside >= MIN_CPU_SAMPLES)


def test_start_up_and_warm_up_samples_do_not_count() -> None:
    """A busy start-up (100 %) before quiet measured iterations (40 %): the mean is 40."""
    samples = [_sample(t, t + 0.5, 100.0) for t in (0.0, 0.5)]
    samples += [_sample(1.0 + 0.5 * i, 1.5 + 0.5 * i, 40.0) for i in range(4)]
    cpu = _sampler(*samples).summary((1.0, 3.0))
    assert (cpu["rated"], cpu["samples"], cpu["machine_cpu_mean_pct"]) == (True, 4, 40.0)
    assert cpu["machine_cpu_mean_pct"] < CPU_SATURATED_PCT
    # without a window (the old rule) the start-up would have counted
    assert _sampler(*samples).summary()["machine_cpu_mean_pct"] == pytest.approx(60.0)


def test_samples_covering_too_little_of_the_window_leave_it_unrated() -> None:
    """Three whole samples in a 10 s window cover 0.3 s: not the iterations' CPU."""
    samples = [_sample(1.0 + 0.1 * i, 1.1 + 0.1 * i, 100.0) for i in range(3)]
    cpu = _sampler(*samples).summary((1.0, 11.0))
    assert cpu["rated"] is False and cpu["covered_s"] == pytest.approx(0.3)


def test_the_breakdown_and_the_machine_figure_come_from_the_same_samples() -> None:
    """Machine 50 % of 2 cores = 1.0 core; the parts take 0.6: other_cores_mean 0.4 names the
    rest (other processes, kernel work). An incomplete sample (a pid's first read) is left out
    of the breakdown."""
    cores = psutil.cpu_count() or 1
    pct = 100.0 / cores  # one core busy, whatever the machine
    parts = {"ranks": 40.0, "ocs-app": 20.0}
    samples = [_sample(0.1 * i, 0.1 * (i + 1), pct, parts) for i in range(4)]
    samples.append(_sample(0.4, 0.5, pct, {"ranks": 0.0, "ocs-app": 0.0}, complete=False))
    cpu = _sampler(*samples).summary((0.0, 0.5))
    assert cpu["component_samples"] == 4
    assert cpu["component_cores_mean"] == {"ocs-app": 0.2, "ranks": 0.4}
    assert cpu["machine_cores_mean"] == pytest.approx(1.0)
    assert cpu["other_cores_mean"] == pytest.approx(0.4)


def test_the_interval_gives_short_runs_enough_samples_within_bounds() -> None:
    assert cpu_interval_s(None) == CPU_INTERVAL_MAX_S
    assert cpu_interval_s(100.0) == CPU_INTERVAL_MAX_S
    assert cpu_interval_s(0.4) == CPU_INTERVAL_MIN_S
    assert cpu_interval_s(2.0) == pytest.approx(0.2)


def test_processes_known_at_start_are_counted_from_the_first_sample() -> None:
    """The sampler reads every known process when it starts, so its first sample already holds
    a busy process's CPU (before, a pid's first read gave 0.0: the issue's all-zero parts)."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(burner.pid).cpu_times().user < 0.05:  # running, past its start
            assert time.monotonic() < deadline
            time.sleep(0.01)
        sampler = CpuSampler(pids=lambda: [burner.pid], interval_s=0.2,
                             components=lambda: {"ranks": [burner.pid]}).start()
        try:
            _wait_for(lambda: len(sampler.samples) >= 1)
        finally:
            sampler.stop()
    finally:
        burner.kill()
        burner.wait(10)
    first = sampler.samples[0]
    assert first.complete and first.t_start_s is not None and first.t_start_s < first.t_s
    # before the fix a pid's first read gave exactly 0.0; a busy loop gets some CPU whatever
    # the machine's load (19.6 % of a core was seen under a load of 40)
    assert first.component_pct["ranks"] > 1.0 and first.emulator_pct > 1.0


def _wait_for(condition: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for CPU samples"
        time.sleep(0.02)


def test_saturation_says_how_much_the_run_itself_took() -> None:
    """Saturated by other processes reads as such: the reason names the run's share."""
    cores = psutil.cpu_count() or 1
    samples = [_sample(0.1 * i, 0.1 * (i + 1), 100.0, {"ranks": 20.0, "ocs-app": 10.0})
               for i in range(4)]
    cpu = _sampler(*samples).summary((0.0, 0.4))
    text = judge(RunEvidence(cpu)).reasons[0].text
    assert f"the run's parts took 0.30 of {cores:.2f} busy cores" in text
    assert f"other processes and kernel work {cores - 0.3:.2f}" in text
