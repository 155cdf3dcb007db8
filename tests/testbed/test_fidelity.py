"""testbed.metrics.fidelity: when a run is called degraded, and why."""

from __future__ import annotations

import time

from testbed.metrics.fidelity import CpuSampler, judge


def test_a_quiet_run_is_ok() -> None:
    cpu = {"machine_cpu_mean_pct": 40.0, "machine_steal_mean_pct": 1.0}
    assert judge(cpu, 0.9, 10, 10) == ("ok", [])


def test_each_reason_is_named() -> None:
    cpu = {"machine_cpu_mean_pct": 97.0, "machine_steal_mean_pct": 30.0}
    verdict, reasons = judge(cpu, 0.5, 10, 9)
    assert verdict == "degraded" and len(reasons) == 4
    assert "saturated (mean 97 %)" in reasons[0]
    assert "30 % of the CPU time to other guests (steal)" in reasons[1]
    assert "only 50 % of the configured link rate" in reasons[2]
    assert "1 of 10 calls did not deliver" in reasons[3]


def test_busy_and_steal_time_are_sampled() -> None:
    sampler = CpuSampler(pids=list, interval_s=0.05).start()
    deadline = time.monotonic() + 5
    while len(sampler.samples) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    summary = sampler.summary()
    assert summary["samples"] >= 2
    assert 0.0 <= summary["machine_steal_mean_pct"] <= 100.0
    assert 0.0 <= summary["machine_cpu_mean_pct"] <= summary["machine_cpu_max_pct"] <= 100.0
