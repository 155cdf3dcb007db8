"""testbed.metrics.fidelity: when a run is degraded, why, whom it blames, and what is sampled."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import namedtuple
from typing import Any

import psutil
import pytest

from testbed.metrics import fidelity
from testbed.metrics.fidelity import (
    CPU_SATURATED_PCT,
    CPU_STEAL_PCT,
    SIMULATED,
    THROUGHPUT_RATIO_MAX,
    THROUGHPUT_RATIO_MIN,
    THROUGHPUT_RATIO_P10_MIN,
    UNRATED_THROUGHPUT,
    CpuSample,
    CpuSampler,
    RunEvidence,
    Verdict,
    judge,
)

QUIET = {"machine_cpu_mean_pct": 40.0, "machine_steal_mean_pct": 1.0}
SATURATED = {"machine_cpu_mean_pct": 97.0, "machine_steal_mean_pct": 1.0}
STOLEN = {"machine_cpu_mean_pct": 60.0, "machine_steal_mean_pct": 30.0}
FAST, SLOW = 0.9, 0.5


@pytest.mark.parametrize(("cpu", "ratio", "delivered", "verdict", "blame", "reason_blames"), [
    (QUIET, FAST, 10, "ok", "none", []),
    (QUIET, None, 10, "ok", "none", []),  # no ring collective to rate: unrated, not blamed
    (QUIET, SLOW, 10, "degraded", "run", ["run"]),  # slow links on a quiet machine
    (QUIET, FAST, 9, "degraded", "run", ["run"]),  # lost bytes
    (SATURATED, FAST, 10, "degraded", "machine", ["machine"]),
    (SATURATED, SLOW, 10, "degraded", "machine", ["machine", "machine"]),
    (SATURATED, SLOW, 9, "degraded", "run", ["machine", "machine", "run"]),
    (STOLEN, FAST, 10, "degraded", "machine", ["machine"]),
    (STOLEN, SLOW, 10, "degraded", "machine", ["machine", "machine"]),
    (STOLEN, FAST, 9, "degraded", "run", ["machine", "run"]),
], ids=["quiet", "quiet-unrated", "quiet-slow", "quiet-lost", "saturated", "saturated-slow",
        "saturated-slow-lost", "stolen", "stolen-slow", "stolen-lost"])
def test_verdict_and_blame(cpu: dict[str, float], ratio: float | None, delivered: int,
                           verdict: str, blame: str, reason_blames: list[str]) -> None:
    v = judge(RunEvidence(cpu, 10, delivered, ratio))
    assert (v.fidelity, v.blame) == (verdict, blame)
    assert [r.blame for r in v.reasons] == reason_blames
    summary = v.to_summary()
    assert summary["fidelity"] == verdict and summary["fidelity_blame"] == blame
    assert summary["fidelity_reasons"] == [r.text for r in v.reasons]
    assert [c["blame"] for c in summary["fidelity_causes"]] == reason_blames


def test_each_reason_names_its_figure() -> None:
    texts = [r.text for r in judge(RunEvidence(SATURATED | {"machine_steal_mean_pct": 30.0}, 10,
                                            9, 0.5)).reasons]
    assert len(texts) == 4
    assert "saturated (mean 97 %)" in texts[0]
    assert "30 % of the CPU time to other guests (steal)" in texts[1]
    assert "only 50 % of the configured link rate" in texts[2]
    assert "1 of 10 calls did not deliver" in texts[3]
    quiet_slow = judge(RunEvidence(QUIET, 10, 10, 0.5)).reasons[0].text
    assert "neither saturated nor stolen" in quiet_slow


@pytest.mark.parametrize(("cpu", "ratio", "degraded"), [
    ({"machine_cpu_mean_pct": CPU_SATURATED_PCT}, FAST, False),
    ({"machine_cpu_mean_pct": CPU_SATURATED_PCT + 0.1}, FAST, True),
    ({"machine_steal_mean_pct": CPU_STEAL_PCT}, FAST, False),
    ({"machine_steal_mean_pct": CPU_STEAL_PCT + 0.1}, FAST, True),
    (QUIET, THROUGHPUT_RATIO_MIN, False),
    (QUIET, THROUGHPUT_RATIO_MIN - 0.001, True),
    (QUIET, THROUGHPUT_RATIO_MAX, False),
    (QUIET, THROUGHPUT_RATIO_MAX + 0.001, True),
], ids=["cpu-at", "cpu-above", "steal-at", "steal-above", "rate-at", "rate-below",
        "unshaped-at", "unshaped-above"])
def test_thresholds_are_strict_at_their_edges(cpu: dict[str, float], ratio: float,
                                              degraded: bool) -> None:
    assert judge(RunEvidence(cpu, 1, 1, ratio)).fidelity == ("degraded" if degraded else "ok")


def test_low_throughput_is_the_machines_only_when_the_cpu_was_busy() -> None:
    at_edge = {"machine_cpu_mean_pct": CPU_SATURATED_PCT, "machine_steal_mean_pct": CPU_STEAL_PCT}
    assert judge(RunEvidence(at_edge, 1, 1, SLOW)).blame == "run"  # no threshold crossed: quiet
    assert judge(RunEvidence({}, 1, 1, SLOW)).blame == "run"  # no CPU samples: nothing excuses it


@pytest.mark.parametrize("cpu", [QUIET, SATURATED, STOLEN], ids=["quiet", "saturated", "stolen"])
def test_an_unshaped_link_degrades_and_blames_the_run_on_any_machine(cpu: dict[str, float]
                                                                      ) -> None:
    """Collectives faster than the link rate: the shaping failed, and no load makes links
    faster."""
    v = judge(RunEvidence(cpu, 10, 10, 1.6, 1.4))
    assert (v.fidelity, v.blame) == ("degraded", "run")
    unshaped = [r for r in v.reasons if "not shaped" in r.text]
    assert [r.blame for r in unshaped] == ["run"]
    assert "160 % of the configured link rate (median), above 105 %" in unshaped[0].text


def test_the_low_tail_is_judged_as_well_as_the_median() -> None:
    ok = judge(RunEvidence(QUIET, 10, 10, FAST, THROUGHPUT_RATIO_P10_MIN))
    assert ok.fidelity == "ok"
    tail = judge(RunEvidence(QUIET, 10, 10, FAST, THROUGHPUT_RATIO_P10_MIN - 0.01))
    assert (tail.fidelity, tail.blame) == ("degraded", "run")
    assert "one collective in ten reached 49 % of the configured link rate or less (p10, " \
           "limit 50 %)" in tail.reasons[0].text
    busy = judge(RunEvidence(SATURATED, 10, 10, FAST, 0.3))
    assert [r.blame for r in busy.reasons] == ["machine", "machine"]


def test_a_run_with_nothing_to_rate_says_unrated() -> None:
    v = judge(RunEvidence(QUIET, 10, 10, None, None))
    assert (v.fidelity, v.unrated) == ("ok", (UNRATED_THROUGHPUT,))
    assert v.to_summary()["fidelity_unrated"] == [UNRATED_THROUGHPUT]
    assert judge(RunEvidence(QUIET, 10, 10, FAST, FAST)).unrated == ()
    assert Verdict("ok").to_summary()["fidelity_unrated"] == []


def test_a_simulated_run_is_not_judged() -> None:
    assert SIMULATED.to_summary() == {"fidelity": "simulated", "fidelity_reasons": [],
                                      "fidelity_blame": "none", "fidelity_causes": [],
                                      "fidelity_unrated": []}


def test_busy_is_what_is_neither_idle_nor_iowait_and_steal_is_read_as_such(
        monkeypatch: pytest.MonkeyPatch) -> None:
    times = namedtuple("times", "user system idle iowait steal")
    monkeypatch.setattr(psutil, "cpu_times_percent",
                        lambda _interval=None: times(20.0, 20.0, 50.0, 10.0, 30.0))
    sampler = CpuSampler(pids=list, interval_s=0.01).start()
    try:
        _wait_for(lambda: len(sampler.samples) >= 2)
    finally:
        sampler.stop()
    assert {(s.machine_pct, s.steal_pct, s.emulator_pct) for s in sampler.samples} == {
        (40.0, 30.0, 0.0)}
    summary = sampler.summary()
    assert summary["machine_cpu_mean_pct"] == summary["machine_cpu_max_pct"] == 40.0
    assert summary["machine_steal_mean_pct"] == 30.0


def test_summary_averages_the_samples() -> None:
    sampler = CpuSampler(pids=list)
    assert sampler.summary()["samples"] == 0 and "machine_cpu_mean_pct" not in sampler.summary()
    sampler.samples += [CpuSample(0.0, 50.0, 100.0, 0.0), CpuSample(1.0, 90.0, 140.0, 20.0)]
    s = sampler.summary()
    assert (s["samples"], s["machine_cpu_mean_pct"], s["machine_cpu_max_pct"],
            s["machine_steal_mean_pct"], s["emulator_cpu_mean_pct"]) == (2, 70.0, 90.0, 10.0,
                                                                           120.0)


def test_sampler_measures_the_processes_it_is_given() -> None:
    """A child burning CPU reads as the CPU time it really used; a sleeping one as none.

    One sampler at a time: psutil keeps one machine-wide "last reading" for all callers.
    """
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        proc = psutil.Process(burner.pid)
        busy = CpuSampler(pids=lambda: [burner.pid], interval_s=0.2).start()
        try:
            # the first sample only starts a pid's count; count the burner's CPU from there
            _wait_for(lambda: len(busy.samples) >= 1)
            cpu0, t0 = sum(proc.cpu_times()[:2]), time.time()
            _wait_for(lambda: len(busy.samples) >= 8)
            cpu1, t1 = sum(proc.cpu_times()[:2]), time.time()
        finally:
            busy.stop()
        idle = CpuSampler(pids=lambda: [sleeper.pid], interval_s=0.2).start()
        try:
            _wait_for(lambda: len(idle.samples) >= 3)
        finally:
            idle.stop()
    finally:
        for child in (burner, sleeper):
            child.kill()
            child.wait(10)
    measured = [s.emulator_pct for s in busy.samples[1:]]
    expected_pct = 100.0 * (cpu1 - cpu0) / (t1 - t0)
    assert expected_pct > 5.0, "the burner got no CPU at all; nothing to compare"
    mean = sum(measured) / len(measured)
    assert mean == pytest.approx(expected_pct, abs=max(10.0, 0.25 * expected_pct))
    assert [s.emulator_pct for s in idle.samples] == [0.0] * len(idle.samples)
    cores = psutil.cpu_count() or 1
    # the burner's CPU is part of the machine's busy time (which is the mean over all cores)
    assert sum(s.machine_pct for s in busy.samples[1:]) * cores >= 0.8 * sum(measured)


def test_vswitchd_pid_file_is_read_from_ovs_rundir(tmp_path: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVS_RUNDIR", str(tmp_path))
    assert fidelity.vswitchd_pids() == []
    (tmp_path / "ovs-vswitchd.pid").write_text("4242\n")
    assert fidelity.vswitchd_pids() == [4242]


def _wait_for(condition: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for CPU samples"
        time.sleep(0.02)


def test_reasons_say_whether_load_can_explain_them() -> None:
    """Slow collectives and a busy CPU are timing (a loaded machine stretches them); lost bytes
    and unshaped links are faults whatever the load: the emulation tests' gate fails on those."""
    busy = {"machine_cpu_mean_pct": CPU_SATURATED_PCT + 5}
    slow = judge(RunEvidence(busy, 10, 9, THROUGHPUT_RATIO_MIN / 2))
    timing = {r.text.split(" ")[0]: r.timing for r in slow.reasons}
    assert timing == {"the": True, "collectives": True, "1": False}, slow.reasons
    unshaped = judge(RunEvidence({}, 10, 10, THROUGHPUT_RATIO_MAX + 0.1))
    assert [(r.blame, r.timing) for r in unshaped.reasons] == [("run", False)]
    assert [c["timing"] for c in slow.to_summary()["fidelity_causes"]] == [
        r.timing for r in slow.reasons]


def test_components_are_reported_as_mean_cores_each() -> None:
    """A component's processes are summed per sample; a component missing from a sample
    counts 0 there, so the mean is over the whole run."""
    sampler = CpuSampler(pids=list)
    sampler.samples += [CpuSample(0.0, 50.0, 0.0, component_pct={"ranks": 80.0, "ocs-app": 4.0}),
                        CpuSample(1.0, 50.0, 0.0, component_pct={"ranks": 120.0})]
    assert sampler.summary()["component_cores_mean"] == {"ocs-app": 0.02, "ranks": 1.0}


def test_a_pid_in_two_components_is_read_once_per_sample() -> None:
    """psutil's per-process percent is since its previous read: a second read in the same
    sample would see ~0, so a pid shared by two parts must give both the same reading."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        sampler = CpuSampler(pids=lambda: [burner.pid], interval_s=0.2,
                             components=lambda: {"a": [burner.pid], "b": [burner.pid]})
        sampler.start()
        try:
            _wait_for(lambda: len(sampler.samples) >= 4)
        finally:
            sampler.stop()
    finally:
        burner.kill()
        burner.wait()
    late = sampler.samples[2:]
    assert all(s.component_pct["a"] == s.component_pct["b"] == s.emulator_pct for s in late)
    # a second read in the sample would give ~0; a loaded machine still gives the burner a few %
    assert max(s.emulator_pct for s in late) > 1.0
