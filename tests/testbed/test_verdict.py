"""The fidelity verdict of a whole emulated run, from its records to ``summary.json``: each
fault injected into a synthetic run comes out degraded and blamed on the run; overruns count
only where they touch the measured figures (no root, no network: :func:`finish_run` on records
written here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from emulator.cpuquota import Throttling, quota_summary
from testbed.experiment.config import RunSettings
from testbed.metrics.darktime import DarkCheck, check_dark_periods
from testbed.metrics.fidelity import UNRATED_THROUGHPUT, RunEvidence, judge
from testbed.results import store
from testbed.results.baseline import with_baseline
from testbed.results.summary import Observed, finish_run, summary_text

QUIET = {"machine_cpu_mean_pct": 40.0, "machine_steal_mean_pct": 1.0,
         "machine_cpu_pressure_pct": 2.0}
CONTENDED = QUIET | {"machine_cpu_pressure_pct": 95.0}
DELAY_MS = 100.0
LINK_MBPS = 8.0
#: one warm-up iteration, then two measured ones, 10 s each
ITERATIONS = [(100.0, 110.0), (110.0, 120.0), (120.0, 130.0)]
#: the switches' dark instants: one at start-up, one in the warm-up, one per measured iteration
T_DARK = [99.0, 105.0, 112.0, 122.0]


@dataclass(frozen=True)
class Facts:
    config: RunSettings
    link_mbps: float = LINK_MBPS
    scale: float = 1.0
    modeled_iteration_s: float | None = None


def _records(ratio: float | None) -> list[dict[str, Any]]:
    """Two ranks' iterations, and per iteration one all-reduce moving 1 MB at ``ratio`` of the
    link rate (None: no call at all, nothing to rate)."""
    out: list[dict[str, Any]] = []
    for rank in (0, 1):
        for it, (a, b) in enumerate(ITERATIONS):
            out.append({"ev": "iteration", "rank": rank, "it": it, "t_start": a, "t_end": b})
            if ratio is None:
                continue
            sent = 1_000_000
            t_ack = a + 7.0
            out.append({"ev": "call", "rank": rank, "it": it, "i": 0, "lane": "dp0",
                        "kind": "allreduce", "axis": "dp", "cid": f"c{it}", "seq": it,
                        "reconfigured": True, "t_intent": t_ack - 0.2, "t_ack": t_ack,
                        "t_end": t_ack + sent * 8 / (LINK_MBPS * 1e6) / ratio, "sent": sent,
                        "received": sent, "expected": sent, "size_bytes": sent,
                        "wire_bytes": sent})
    return out


def _ocs_log(dark_ms: list[float], recorded_ms: float = DELAY_MS) -> list[dict[str, Any]]:
    out = []
    for t_dark, dark in zip(T_DARK, dark_ms, strict=True):
        t_light = t_dark + dark / 1e3
        out += [{"event": "dark", "rail": 0, "ports": [1, 2], "t_s": t_dark,
                 "delay_ms": recorded_ms},
                {"event": "light", "rail": 0, "added": [], "removed": [],
                 "t_request_s": t_dark, "t_dark_s": t_dark, "t_light_s": t_light,
                 "t_s": t_light}]
    return out


def _controller_log(dark_ms: list[float], wait_s: float = 0.0) -> list[dict[str, Any]]:
    """The controller's view: each switch asked ``wait_s`` after the collective was ready (it
    waited on the light before too), acked once lit."""
    out: list[dict[str, Any]] = []
    for k, (t_dark, dark) in enumerate(zip(T_DARK, dark_ms, strict=True)):
        t_light = t_dark + dark / 1e3
        out += [{"event": "intent", "job": "train", "group": "dp0", "seq": k,
                 "t_s": t_dark - wait_s},
                {"event": "reconfig_end", "rail": 0, "decision": k, "added": [[1, 2]],
                 "removed": [], "t_dark_s": t_dark, "t_light_s": t_light, "dark_ms": dark,
                 "t_s": t_light},
                {"event": "ack", "job": "train", "group": "dp0", "seq": k,
                 "t_s": t_light + 0.001}]
    out.append({"event": "end", "t_s": 200.0})
    return out


def _finish(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *,
            dark_ms: list[float] | None = None, recorded_ms: float = DELAY_MS,
            ratio: float | None = 0.9, cpu: dict[str, Any] = QUIET,
            dark: DarkCheck | None = None, wait_s: float = 0.0,
            quota: dict[str, Any] | None = None, modeled_s: float | None = None
            ) -> dict[str, Any]:
    monkeypatch.setattr(store, "render_run", lambda _out: [])  # no plots needed
    dark_ms = dark_ms or [DELAY_MS + 0.5] * len(T_DARK)
    events = _controller_log(dark_ms, wait_s)
    if dark is None:
        dark = check_dark_periods(_ocs_log(dark_ms, recorded_ms), DELAY_MS, events)
    cfg = RunSettings(name="verdict", mode="on-demand", switching_delay=DELAY_MS, warmup=1,
                      iterations=2)
    out = tmp_path / "run"
    out.mkdir(parents=True)
    return finish_run(out, Facts(cfg, modeled_iteration_s=modeled_s),
                      Observed(_records(ratio), events, cpu, 1.0, dark, quota),
                      {"world_size": 2}, num_rails=1, ranks_rail0=[0, 1])


def test_a_clean_run_is_ok_and_reports_its_switches_by_where_they_fell(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _finish(tmp_path, monkeypatch)
    assert (s["fidelity"], s["fidelity_blame"], s["fidelity_unrated"]) == ("ok", "none", [])
    dark = s["dark_error_ms"]
    assert (dark["count"], dark["measured"]["count"], dark["unmeasured"]["count"]) == (4, 2, 2)
    bound = s["dark_overrun_bound"]
    assert bound["per_iteration_s"] == pytest.approx([0.0005, 0.0005])
    assert bound["iteration_pct"] == pytest.approx(0.005)
    assert (bound["iteration_limit_pct"], bound["overhead_limit_pct"]) == (1.0, 5.0)
    assert s["throughput_rated_calls"] == 6
    text = summary_text(s)
    assert "throughput          median 0.90, p10 0.90 of the configured 8 Mbit/s over 6 " \
           "calls" in text
    assert "fidelity            ok" in text


def test_the_cpu_line_names_each_part_largest_first(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    s = _finish(tmp_path, monkeypatch)
    s["cpu"] = {**s["cpu"], "component_cores_mean": {"ocs-app": 0.02, "ranks": 0.5,
                                                     "ovs-vswitchd": 0.31}}
    assert "cpu (cores)         ranks 0.50, ovs-vswitchd 0.31, ocs-app 0.02" in summary_text(s)


def test_a_start_up_overrun_does_not_degrade(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    s = _finish(tmp_path, monkeypatch, dark_ms=[600.0, 400.0, 100.5, 100.5], cpu=QUIET)
    assert s["fidelity"] == "ok"
    assert s["dark_error_ms"]["unmeasured"]["max"] == pytest.approx(500.0)
    assert s["dark_overrun_bound"]["max_s"] == pytest.approx(0.0005)
    assert "start-up and warm-up (not judged): error p50 +400.00 ms" in summary_text(s)


def test_an_overrun_in_the_measured_iterations_past_the_limit_degrades(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """150 ms of late light in a 10 s iteration: 1.5 % of it, over the 1 % limit."""
    dark_ms = [100.5, 100.5, 250.0, 100.5]
    quiet = _finish(tmp_path / "q", monkeypatch, dark_ms=dark_ms)
    assert (quiet["fidelity"], quiet["fidelity_blame"]) == ("degraded", "run")
    assert quiet["dark_overrun_bound"]["iteration_pct"] == pytest.approx(1.5)
    assert "1.50 % of an iteration (limit 1 %)" in quiet["fidelity_reasons"][0]
    busy = _finish(tmp_path / "b", monkeypatch, dark_ms=dark_ms, cpu=CONTENDED)
    assert (busy["fidelity"], busy["fidelity_blame"]) == ("degraded", "machine")


@pytest.mark.parametrize(("name", "dark_ms", "recorded_ms"), [
    ("doubled delay", 2 * DELAY_MS + 0.5, 2 * DELAY_MS),
    ("delay 20 % short", 0.8 * DELAY_MS + 0.5, 0.8 * DELAY_MS),
    ("early light", DELAY_MS - 5.0, DELAY_MS),
])
@pytest.mark.parametrize("cpu", [QUIET, CONTENDED], ids=["quiet", "contended"])
def test_a_wrong_delay_or_early_light_blames_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, dark_ms: float,
        recorded_ms: float, cpu: dict[str, Any]) -> None:
    s = _finish(tmp_path, monkeypatch, dark_ms=[dark_ms] * len(T_DARK),
                recorded_ms=recorded_ms, cpu=cpu)
    assert (s["fidelity"], s["fidelity_blame"]) == ("degraded", "run"), name
    assert any(c["blame"] == "run" for c in s["fidelity_causes"])


@pytest.mark.parametrize("cpu", [QUIET, CONTENDED], ids=["quiet", "contended"])
def test_an_unshaped_link_blames_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         cpu: dict[str, Any]) -> None:
    s = _finish(tmp_path, monkeypatch, ratio=1.5, cpu=cpu)
    assert (s["fidelity"], s["fidelity_blame"]) == ("degraded", "run")
    assert "the links were not shaped" in s["fidelity_reasons"][0]


def test_an_empty_ocs_log_on_a_polatis_run_blames_the_run(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    dark = check_dark_periods([], DELAY_MS, _controller_log([DELAY_MS] * len(T_DARK)),
                              counts_compared=False)
    s = _finish(tmp_path, monkeypatch, dark=dark)
    assert (s["fidelity"], s["fidelity_blame"]) == ("degraded", "run")
    assert "the OCS app logged no dark period" in s["fidelity_reasons"][0]
    assert "dark periods        no switches" in summary_text(s)


def test_a_run_with_no_call_to_rate_says_unrated(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    s = _finish(tmp_path, monkeypatch, ratio=None)
    assert (s["fidelity"], s["fidelity_unrated"]) == ("ok", [UNRATED_THROUGHPUT])
    text = summary_text(s)
    assert ("throughput          unrated: no ring collective long enough to rate against the "
            "configured 8 Mbit/s") in text
    assert f"fidelity            ok; unrated: {UNRATED_THROUGHPUT}" in text


def test_with_a_baseline_the_bound_is_judged_against_the_overhead_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """20 ms of late light per measured iteration is 0.2 % of a 10 s iteration and 1.8 % of the
    1.12 s of exposed switching, but 10 % of a 0.2 s overhead against the baseline."""
    dark_ms = [100.5, 100.5, 120.0, 120.0]
    s = _finish(tmp_path / "run", monkeypatch, dark_ms=dark_ms, wait_s=1.0)
    assert s["fidelity"] == "ok"
    assert s["dark_overrun_bound"]["overhead_pct"] == pytest.approx(100 * 0.02 / 1.121)
    big = with_baseline(dict(s), {"iteration_time_s": 9.0})  # a 1 s overhead: 2 %
    assert big["fidelity"] == "ok"
    assert big["dark_overrun_bound"]["baseline_overhead_pct"] == pytest.approx(2.0)
    small = with_baseline(_finish(tmp_path / "again", monkeypatch, dark_ms=dark_ms,
                                  wait_s=1.0), {"iteration_time_s": 9.8})
    assert (small["fidelity"], small["fidelity_blame"]) == ("degraded", "run")
    assert "10.0 % of the overhead against the baseline (limit 5 %)" in (
        small["fidelity_reasons"][-1])
    assert with_baseline(small, {"iteration_time_s": 9.8})["fidelity_reasons"] == (
        small["fidelity_reasons"])  # judged once
    none = with_baseline(_finish(tmp_path / "none", monkeypatch, dark_ms=dark_ms, wait_s=1.0),
                         {"iteration_time_s": 10.5})  # faster than its baseline
    assert none["fidelity"] == "degraded"
    assert "more than the whole overhead against the baseline (none)" in (
        none["fidelity_reasons"][-1])
    sim = {"fidelity": "simulated", "iteration_time_s": 10.0, "dark_overrun_bound": None}
    assert with_baseline(dict(sim), {"iteration_time_s": 9.99})["fidelity"] == "simulated"


def _quota(throttled: int, periods: int = 1000) -> dict[str, Any]:
    """The summary's ``rank_cpu_quota`` of a 0.7 quota on 2 cores, throttled in ``throttled`` of
    ``periods`` periods."""
    return quota_summary(0.7, 0.7, 2, "opus-testbed-otabc", 1,
                         Throttling(periods, throttled, throttled * 0.02))


@pytest.mark.parametrize("cpu", [QUIET, CONTENDED | {"machine_cpu_mean_pct": 97.0}],
                         ids=["quiet", "saturated"])
def test_a_quota_that_slowed_the_workload_is_named_not_the_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu: dict[str, Any]) -> None:
    """10 s iterations against 8 s modelled (+~0.1 s of switching waited for), with the ranks
    throttled in 30 % of the quota's periods: the quota's doing, and the slow collectives
    too unless the machine was saturated besides (then those are the machine's)."""
    s = _finish(tmp_path, monkeypatch, quota=_quota(300), modeled_s=8.0, ratio=0.4, cpu=cpu)
    assert (s["fidelity"], s["fidelity_blame"]) == ("degraded", "quota")
    quota_causes = [c for c in s["fidelity_causes"] if c["blame"] == "quota"]
    assert len(quota_causes) == (2 if cpu is QUIET else 1), s["fidelity_causes"]
    text = quota_causes[0]["reason"]
    assert "run.rank_cpu_quota 0.7: 0.70 of the machine, 1.4 cores" in text
    assert "held them back in 30 % of its periods" in text
    assert "+2" in text and "tolerance 10 %" in text
    slow = [c for c in s["fidelity_causes"] if "collectives reached only 40 %" in c["reason"]]
    assert [c["blame"] for c in slow] == ["quota" if cpu is QUIET else "machine"]
    assert s["rank_cpu_quota"]["throttled_share"] == pytest.approx(0.3)
    printed = summary_text(s)
    assert "rank CPU quota      0.70 of the machine (1.4 cores; 0.7) for the ranks, cgroup v1; " \
           "throttled in 300/1000 periods (30 %), 6.00 s held back" in printed
    assert "fidelity            degraded (blamed on the quota): " in printed


@pytest.mark.parametrize(("throttled", "modeled_s"), [
    (10, 8.0),   # 1 % of the periods: the quota did not bite
    (300, 9.5),  # within 10 % of the modelled step and its switching
    (300, None),  # no model to compare with (a torch job)
])
def test_a_quota_is_not_blamed_unless_it_bit_and_the_iterations_ran_long(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, throttled: int,
        modeled_s: float | None) -> None:
    s = _finish(tmp_path, monkeypatch, quota=_quota(throttled), modeled_s=modeled_s)
    assert (s["fidelity"], s["fidelity_blame"]) == ("ok", "none"), s["fidelity_reasons"]
    assert s["rank_cpu_quota"]["nr_throttled"] == throttled


def test_without_a_quota_slow_collectives_stay_the_runs(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    s = _finish(tmp_path, monkeypatch, modeled_s=8.0, ratio=0.4)
    assert (s["fidelity"], s["fidelity_blame"], s["rank_cpu_quota"]) == ("degraded", "run", None)
    assert "rank CPU quota" not in summary_text(s)


def test_a_lost_byte_under_a_quota_still_blames_the_run() -> None:
    verdict = judge(RunEvidence(QUIET, calls=4, calls_delivered=3, quota=_quota(500),
                                iteration_s=10.0, expected_iteration_s=8.0))
    assert [r.blame for r in verdict.reasons] == ["quota", "run"]
    assert verdict.blame == "run"


def test_slow_collectives_under_a_biting_quota_on_a_quiet_machine_are_the_quotas() -> None:
    """Iterations as modelled, but collectives at half the link rate while the quota bit."""
    verdict = judge(RunEvidence(QUIET, calls=4, calls_delivered=4, throughput_ratio_median=0.5,
                                quota=_quota(300), iteration_s=8.0, expected_iteration_s=8.0))
    assert verdict.blame == "quota" and len(verdict.reasons) == 1
    assert verdict.reasons[0].text.startswith("collectives reached only 50 % of the configured "
                                              "link rate (median): the ranks' CPU quota")
    unbitten = judge(RunEvidence(QUIET, calls=4, calls_delivered=4,
                                 throughput_ratio_median=0.5, quota=_quota(10)))
    assert unbitten.blame == "run"
