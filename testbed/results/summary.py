"""The end of a run, on either backend: metrics, the fidelity verdict, tables, summary, plots.

:func:`finish_run` turns what the ranks recorded and the controller logged into the results
directory (:mod:`testbed.results.store`); :func:`summary_text` is the one-screen summary printed
at the end of ``opus-testbed run``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from emulator.cpuquota import quota_text
from testbed.experiment.backends import EMU, backend_spec
from testbed.experiment.config import RunSettings
from testbed.experiment.prepare import Prepared
from testbed.metrics import tcpstats
from testbed.metrics.callcost import CallCostBound, call_cost_bound, overhead_effect_pts
from testbed.metrics.callcost import overhead_exceeded as call_overhead_exceeded
from testbed.metrics.compute import (
    RunMetrics,
    compute_metrics,
    exposed_intervals,
    rail_state_counts,
)
from testbed.metrics.darktime import (
    DarkCheck,
    OverrunBound,
    dark_text,
    overhead_exceeded,
    overrun_bound,
)
from testbed.metrics.exposure import exposure_overlapped_s
from testbed.metrics.failover import failover_summary, failover_table
from testbed.metrics.fidelity import (
    SIMULATED,
    RunEvidence,
    add_reason,
    call_cost_reason,
    judge,
    overrun_reason,
)
from testbed.metrics.startgate import gate_summary
from testbed.metrics.wire import WireVerdict, wire_cost, wire_text
from testbed.results import store

#: Where every ``summary.json`` field is described: (file from the repository root, heading
#: of the section whose table lists them). tests/testbed/test_summary_fields.py keeps it
#: complete; move both together.
FIELD_TABLE = ("docs/results.md", "The summary's fields")


class RunFacts(Protocol):
    """What the end of a run needs from its preparation (a generated schedule's
    :class:`~testbed.experiment.prepare.Prepared`, or a torch job's)."""

    @property
    def config(self) -> RunSettings: ...

    @property
    def link_mbps(self) -> float: ...

    @property
    def scale(self) -> float: ...

    @property
    def modeled_iteration_s(self) -> float | None: ...


@dataclass(frozen=True)
class Observed:
    """What a backend observed of a finished run, handed to :func:`finish_run` as one value:
    the ranks' records, the controller's events, the CPU samples
    (:meth:`~testbed.metrics.fidelity.CpuSampler.summary`), the wall-clock time, the
    emulated OCS's dark periods (None on the sim backend, whose switches last the delay
    exactly, and without an OCS) and the ranks' CPU quota with its throttling
    (:func:`emulator.cpuquota.quota_summary`; None: no quota)."""

    records: list[dict[str, Any]]
    events: list[dict[str, Any]]
    cpu: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    dark: DarkCheck | None = None
    quota: dict[str, Any] | None = None
    wire: WireVerdict | None = None  # the capture's judgement (None: no wire check)
    #: a switched run without a capture: why, and that the wire saw none of its switches
    wire_skipped: dict[str, Any] | None = None


def run_evidence(seen: Observed, m: RunMetrics, windows: Sequence[tuple[float, float]],
                 modeled_iteration_s: float | None = None,
                 call_cost: CallCostBound | None = None,
                 tcp_timers: Mapping[str, Any] | None = None,
                 time_dilation: float = 1.0) -> RunEvidence:
    """What the run's verdict rests on (:func:`~testbed.metrics.fidelity.judge`), from what
    was observed and the metrics. Only switches inside the measured iterations (``windows``)
    bear on the figures; the late light among them counts where some collective waited on
    light. An iteration is expected to take the modelled step plus the switching it waited
    for (none without a model)."""
    s = m.summary
    bound = None
    if seen.dark is not None:
        sws = (list(seen.dark.switches) if seen.wire is None
               else seen.wire.bound_switches(seen.dark.switches))
        bound = overrun_bound(sws, windows, ((a, b) for a, b, _g, _s
                                             in exposed_intervals(seen.events)))
    expected = (None if modeled_iteration_s is None
                else modeled_iteration_s + (s.get("exposed_reconfig_s") or 0.0))
    return RunEvidence(seen.cpu, s["calls"], s["calls_delivered"],
                       s["throughput_ratio_median"], s["throughput_ratio_p10"], seen.dark,
                       bound, seen.quota, s.get("iteration_time_s"), expected,
                       wire_faults=tuple(seen.wire.run_faults()) if seen.wire else (),
                       wire_timing_faults=tuple(seen.wire.timing_faults()) if seen.wire else (),
                       call_cost=call_cost,
                       tcp_stall=tcpstats.stall_fault(tcp_timers, time_dilation))


def finish_run(out: Path, prep: RunFacts, seen: Observed, manifest: dict[str, Any], *,
               num_rails: int, ranks_rail0: list[int], backend: str = EMU,
               costs: str | None = None) -> dict[str, Any]:
    """Metrics, fidelity verdict, tables, summary and plots of a finished run; ``costs`` is a
    simulation's cost model (``fabric`` or ``emulator``; None for an emulated run)."""
    spec = backend_spec(backend)  # what its clock lets the summary judge
    cfg = prep.config
    workload = getattr(cfg, "workload", None)  # a torch job has none
    records, events, cpu, dark = seen.records, seen.events, seen.cpu, seen.dark
    switched = cfg.mode != "baseline"  # its gaps between phases hold its waits for light
    m = compute_metrics(records, events, warmup=cfg.warmup, link_mbps=prep.link_mbps,
                        scale=prep.scale, num_rails=num_rails, switched=switched)
    compute_rows = [{"rank": r["rank"], "it": r["it"], "op": r["i"], "t_start": r["t_start"],
                     "t_end": r["t_end"]} for r in records if r.get("ev") == "compute"]
    for name, rows in (("iterations", m.iterations), ("calls", m.calls),
                       ("compute", compute_rows), ("gaps" if switched else "windows",
                                                   m.windows),
                       ("circuits", m.circuits), ("rails", m.rails)):
        store.write_csv(out / f"{name}.csv", rows)
    s = m.summary
    windows = [(float(r["t_start_s"]), float(r["t_end_s"])) for r in m.iterations
               if r["measured"]]
    k = float(getattr(prep, "time_dilation", 1.0))
    call_costs = (call_cost_bound(records, warmup=cfg.warmup, link_mbps=prep.link_mbps,
                                  scale=prep.scale, iteration_s=s.get("iteration_time_s"),
                                  events=events)
                  if spec.clock == "wall" else None)
    tcp_timers = (tcpstats.iteration_counts(records, cfg.warmup) if spec.clock == "wall"
                  else None)
    evidence = run_evidence(seen, m, windows, prep.modeled_iteration_s, call_costs,
                            tcp_timers, k)
    bound: OverrunBound | None = evidence.overrun
    # a virtual clock has no CPU limit to check: the sim backend's runs are not judged
    verdict = judge(evidence) if spec.judged else SIMULATED
    expected_iterations = cfg.total_iterations
    summary = {"name": cfg.name, "backend": backend, "costs": costs, "mode": cfg.mode,
               "switching_delay_ms": cfg.switching_delay_ms,
               "semantics": cfg.effective_semantics,
               "request_points": cfg.effective_request_points,
               "rail_state_inflight": cfg.rail_state_inflight,
               "ports_per_rank": cfg.effective_ports_per_rank, "link_mbps": prep.link_mbps,
               "scale": prep.scale, "world_size": manifest["world_size"],
               "warmup": cfg.warmup, "iterations": cfg.iterations,
               "all_iterations_completed": s["iterations_completed"] == expected_iterations,
               **s, **verdict.to_summary(), "cpu": cpu, "rank_cpu_quota": seen.quota,
               "modeled_iteration_s": prep.modeled_iteration_s,
               "calibrate_step_s": workload.calibrate_step_s if workload else None,
               "compute_scale": workload.compute_scale if workload else None,
               "dark_error_ms": dark.to_summary(windows) if dark is not None else None,
               "dark_overrun_bound": bound.to_summary() if bound is not None else None,
               "wire": (_with_cost(seen.wire.to_summary(), cpu) if seen.wire is not None
                        else seen.wire_skipped),
               "wall_s": seen.wall_s,
               **(dilation_keys(prep, seen, dark, windows, k) if spec.dilates else {}),
               "call_cost_bound": call_costs.to_summary() if call_costs is not None else None,
               "exposed_reconfig_overlapped_s": exposure_overlapped_s(
                   records, ((a, b) for a, b, _g, _s in exposed_intervals(events)), windows),
               "mispredictions": sum(e.get("event") == "mispredict" for e in events),
               "profile_mismatches": sum(int(r.get("profile_mismatches", 0)) for r in records
                                         if r.get("ev") == "finished"),
               "timeline_ranks": ranks_rail0, "timeline_rails": [0]}
    if tcp_timers is not None:
        summary["tcp_timers"] = tcp_timers
    gate = gate_summary(records)
    if gate is not None:
        summary["start_gate"] = gate
    counts = rail_state_counts(events)
    if counts is not None:
        summary["rail_state"] = counts
    summary.update(_failover_keys(out, prep, records, events, m.iterations))
    store.write_json(out / "summary.json", summary)
    manifest.update(status="done", finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    store.write_json(out / "manifest.json", manifest)
    store.render_run(out)
    return summary


def dilation_keys(prep: RunFacts, seen: Observed, dark: DarkCheck | None,
                  windows: Sequence[tuple[float, float]], k: float) -> dict[str, Any]:
    """The summary's time dilation: the factor, how it was chosen, the run's model time
    (``wall_s`` / k) and the dark-time errors on the wall (model ms x k)."""
    choice = getattr(prep, "dilation", None)
    out: dict[str, Any] = {"time_dilation": k, "model_s": seen.wall_s / k,
                           "time_dilation_choice": (choice.to_json() if choice is not None
                                                    else None)}
    if dark is not None:
        out["dark_error_wall_ms"] = _scaled(dark.to_summary(windows), k)
    return out


def _scaled(stats: dict[str, Any], k: float) -> dict[str, Any]:
    """``dark_error_ms``'s statistics (model ms) on the wall clock: times ``k``."""
    out: dict[str, Any] = {}
    for key, value in stats.items():
        if isinstance(value, dict) and key in ("measured", "unmeasured"):
            out[key] = _scaled(value, k)
        elif key in ("p50", "p99", "max", "min") and isinstance(value, int | float):
            out[key] = value * k
        elif key == "count":
            out[key] = value
    return out


def _failover_keys(out: Path, prep: RunFacts, records: list[dict[str, Any]],
                   events: list[dict[str, Any]], iterations: list[dict[str, Any]]
                   ) -> dict[str, Any]:
    """Failover figures and ``failovers.csv``, for runs with faults or recoveries (a torch job
    has neither: it runs no replay plan)."""
    if not isinstance(prep, Prepared):
        return {}
    rows, keys = failover_keys(prep, records, events, iterations)
    if rows or prep.config.faults:
        store.write_csv(out / "failovers.csv", rows)
    return keys


def judge_against_baseline(summary: dict[str, Any]) -> dict[str, Any]:
    """Once a run's baseline is known (``baseline_iteration_time_s``): the bound late light puts
    on the overhead itself, beside the one on the exposed switching that :func:`finish_run`
    judged; past the limit the run is degraded (blamed as any overrun). Returns ``summary``."""
    bound = summary.get("dark_overrun_bound")
    it, base = summary.get("iteration_time_s"), summary.get("baseline_iteration_time_s")
    if not bound or it is None or base is None:
        return summary
    text = overhead_exceeded(bound, it, base)
    if text:
        add_reason(summary, overrun_reason(text, summary.get("cpu") or {}))
    return summary


def judge_call_costs(summary: dict[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Once the baseline is known: the per-call costs' effect on the overhead (the difference
    of the two runs' bounds, :func:`~testbed.metrics.callcost.overhead_effect_pts`), recorded
    in ``call_cost_bound`` and judged. Returns ``summary``."""
    pts = overhead_effect_pts(summary, baseline)
    if pts is None:
        return summary
    summary["call_cost_bound"]["overhead_pts"] = round(pts, 4)
    text = call_overhead_exceeded(pts)
    if text:
        add_reason(summary, call_cost_reason(text, summary.get("cpu") or {}))
    return summary


def failover_keys(prep: Prepared, records: list[dict[str, Any]], events: list[dict[str, Any]],
                  iterations: list[dict[str, Any]]
                  ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The recoveries (:func:`~testbed.metrics.failover.failover_table`) and the summary's
    failover keys; none for a run without faults or recoveries."""
    members = {gid: g.ranks for gid, g in prep.plan.groups.items()}
    rows = failover_table(events, members)
    if not rows and not prep.config.faults:
        return rows, {}
    calls = {r: sum(1 for op in ops if op.is_call) for r, ops in prep.plan.programs.items()}
    keys = failover_summary(rows, iterations, records, calls, prep.config.total_iterations)
    keys["faults_injected"] = sum(1 for e in events if e.get("event") == "fault")
    failed = [e for e in events if e.get("event") == "reconfig_failed"]
    keys["reconfigurations_refused"] = sum(1 for e in failed if not e.get("withdrawn"))
    keys["reconfigurations_withdrawn"] = sum(1 for e in failed if e.get("withdrawn"))
    keys["call_retries"] = sum(int(r.get("retries", 0)) for r in records
                               if r.get("ev") == "call")
    return rows, keys


def _exposure_note(summary: dict[str, Any]) -> str:
    """Why the exposure exceeds the overhead, where it does (:mod:`testbed.metrics.exposure`):
    it counts every rank's waits, also while other ranks computed or sent."""
    t, base = summary.get("iteration_time_s"), summary.get("baseline_iteration_time_s")
    exposed = summary.get("exposed_reconfig_s")
    overlapped = summary.get("exposed_reconfig_overlapped_s")
    if t is None or base is None or exposed is None or exposed <= t - base:
        return ""
    pad = "\n" + " " * 20
    hidden = ("" if overlapped is None else
              f", {overlapped:.3f} s of them while{pad}other ranks computed or sent;")
    return (f"{pad}(> the {t - base:.3f} s overhead: every rank's waits count{hidden} "
            "only critical-path waits lengthen the iteration)")


def summary_text(summary: dict[str, Any]) -> str:
    """The one-screen summary printed at the end of a run."""
    def f(key: str, fmt: str = "{:.3f}") -> str:
        v = summary.get(key)
        return "n/a" if v is None else fmt.format(v)

    lines = [
        f"== {summary['name']}: "
        + (f"plane {summary['plane']}" if summary.get("plane") else str(summary["mode"])) + " "
        f"({summary['switching_delay_ms']:g} ms switching, K={summary['ports_per_rank']}, "
        f"{summary.get('semantics', 'port-exact')}, {summary['backend']}"
        + (f", costs {summary['costs']}" if summary.get("costs") else "") + ") ==",
        f"iteration time      {f('iteration_time_s')} s  (mean of {summary['iterations']} after "
        f"{summary['warmup']} warm-up; each: "
        + ", ".join(f"{t:.3f}" for t in summary.get("iteration_times_s", [])) + ")",
    ]
    if summary.get("baseline_iteration_time_s") is not None:
        lines.append(f"baseline            {f('baseline_iteration_time_s')} s  -> overhead "
                     f"{f('overhead_pct', '{:+.2f}')} %")
    lines += [
        f"reconfigurations    {summary['reconfigurations']} rail switches "
        f"({f('reconfigurations_per_iteration', '{:.1f}')} per measured iteration)",
        f"exposed reconfig    {f('exposed_reconfig_s')} s per iteration waiting on light"
        + _exposure_note(summary),
        f"windows             {windows_text(summary)}",
        f"delivery            {summary['calls_delivered']}/{summary['calls']} calls complete, "
        f"{summary['bytes_received_scaled']}/{summary['bytes_expected_scaled']} bytes",
        f"throughput          {_throughput_text(summary)}",
        f"fidelity            {_fidelity_text(summary)}",
    ]
    if summary.get("gaps") is not None:
        lines.insert(-3, f"gaps (this run)     {summary['gaps']} between phases, its waits for "
                     f"light included (median {f('gap_median_s')} s; not windows)")
    if "recovery" in summary:
        lines.insert(-1, _failover_text(summary))
    if summary["backend"] == EMU:
        lines.insert(-1, "dark periods        " + dark_text(summary.get("dark_error_ms"),
                                                        summary.get("dark_overrun_bound")))
        lines.insert(-1, "time dilation       " + dilation_text(summary))
        if summary.get("call_cost_bound"):
            lines.insert(-1, "per-call costs      " + call_cost_text(summary))
        if summary.get("wire") is not None:
            lines.insert(-1, "wire                " + wire_text(summary["wire"]))
        cpu = summary.get("cpu") or {}
        parts = cpu.get("component_cores_mean")
        if parts:
            lines.insert(-1, "cpu (cores)         " + cpu_parts_text(parts, cpu))
    if summary.get("rank_cpu_quota") is not None:
        lines.insert(-1, "rank CPU quota      " + quota_text(summary["rank_cpu_quota"]))
    if summary.get("calibrate_step_s") is not None:
        lines.insert(2, f"calibration         {_calibration_text(summary)}")
    if "loss_max_abs_diff" in summary:  # a torch job: its losses against the loopback run
        lines.append(f"losses              max |rails - loopback| = "
                     f"{summary['loss_max_abs_diff']} over {summary['losses_compared']} "
                     "(rank, step) losses")
    return "\n".join(lines)


def dilation_text(summary: dict[str, Any]) -> str:
    """The factor, how it was chosen, model and wall time, and the dark-time error in both."""
    k = float(summary.get("time_dilation") or 1.0)
    how = (summary.get("time_dilation_choice") or {}).get("how", "file")
    text = (f"{k:g} ({'auto' if how == 'auto' else 'as configured'}): every figure in model "
            f"time; the run took {summary.get('model_s') or 0.0:.1f} s of model time, "
            f"{summary.get('wall_s') or 0.0:.1f} s of wall time")
    model = (summary.get("dark_error_ms") or {}).get("measured") or {}
    wall = (summary.get("dark_error_wall_ms") or {}).get("measured") or {}
    if model.get("count") and model.get("p50") is not None and wall.get("p50") is not None:
        text += (f"; dark-time error p50 {model['p50']:+.3f} ms model, {wall['p50']:+.3f} ms "
                 f"wall (max {model['max']:+.3f} / {wall['max']:+.3f})")
    return text


def call_cost_text(summary: dict[str, Any]) -> str:
    """The emulator's per-call costs and what they may add to an iteration and the overhead."""
    b = summary["call_cost_bound"]
    pct = b.get("iteration_pct")
    excess = ", ".join(f"{kind} {ms:.2f}" for kind, ms in (b.get("excess_ms") or {}).items())
    text = (f"control round trip {b.get('control_ms') or 0.0:.2f} ms, transport ms per call "
            f"{excess or 'n/a'}: up to {1e3 * b['per_iteration_s']:.1f} ms on an iteration ("
            + ("n/a" if pct is None else f"{pct:.1f} %")
            + f" of it, limit {b['iteration_limit_pct']:g} %)")
    pts = b.get("overhead_pts")
    if pts is not None:
        text += f"; {pts:.2f} points of the overhead (limit {b['overhead_limit_pts']:g})"
    return text


def windows_text(summary: dict[str, Any]) -> str:
    """The windows line: the electrical baseline's gaps between phases (paper §3.1), against
    this run's switching delay; n/a for a switched run without its baseline."""
    count = summary.get("windows")
    if count is None:
        return "n/a (measured on the electrical baseline: run with --baseline)"
    median = summary.get("window_median_s")
    text = f"{count} on the electrical baseline (median " + (
        "n/a" if median is None else f"{median:.4f}") + " s"
    at_least = summary.get("windows_at_least_delay_pct")
    if at_least is not None:
        text += (f"; {at_least:.0f} % at least the {summary['switching_delay_ms']:g} ms "
                 "switching delay")
    over = summary.get("windows_over_1ms_pct")
    if over is not None:
        text += f"; {over:.0f} % over 1 ms"
    empty = summary.get("windows_empty")
    if empty:
        text += f"; {empty} empty (<= 0)"
    return text + ")"


def _with_cost(wire: dict[str, Any], cpu: dict[str, Any]) -> dict[str, Any]:
    """``summary["wire"]`` with the check's own cost (:func:`~testbed.metrics.wire.wire_cost`)
    beside its figures, never only inside them."""
    cost = wire_cost(cpu)
    return {**wire, "cost": cost} if cost is not None else wire


def cpu_parts_text(cores: dict[str, float], cpu: dict[str, Any] | None = None) -> str:
    """The run's mean CPU per part, largest first: ``ranks 0.52, ovs-vswitchd 0.31, ...``,
    then the machine's busy cores over the same samples and what no part accounts for."""
    text = ", ".join(f"{name} {value:.2f}"
                     for name, value in sorted(cores.items(), key=lambda kv: -kv[1]))
    machine, other = (cpu or {}).get("machine_cores_mean"), (cpu or {}).get("other_cores_mean")
    if machine is not None and other is not None:
        text += (f"; machine {machine:.2f} of {(cpu or {}).get('cores')}, of which other "
                 f"processes and kernel work {other:.2f}")
    return text


#: A measured baseline further than this from the calibration target is pointed out.
CALIBRATION_GAP_PCT = 3.0


def calibration_gap_pct(baseline_s: float, target_s: float) -> float:
    """How far a measured baseline step is from the calibration target, in %."""
    return 100.0 * (baseline_s / target_s - 1.0)


def _calibration_text(summary: dict[str, Any]) -> str:
    """The compute scale, the modelled step it gives, and the measured baseline against it."""
    target = summary["calibrate_step_s"]
    text = (f"compute x{summary['compute_scale']:.4f}: modelled electrical step "
            f"{summary['modeled_iteration_s']:.3f} s (target {target:g} s)")
    base = summary.get("iteration_time_s" if summary["mode"] == "baseline"
                       else "baseline_iteration_time_s")
    if base is None:
        return text
    gap = calibration_gap_pct(base, target)
    far = f", more than {CALIBRATION_GAP_PCT:g} % off" if abs(gap) > CALIBRATION_GAP_PCT else ""
    return f"{text}; measured baseline {base:.3f} s ({gap:+.1f} %{far})"


def _failover_text(summary: dict[str, Any]) -> str:
    def f(key: str) -> str:
        v = summary.get(key)
        return "n/a" if v is None else f"{v:.3f}"

    kind = (f"{summary['failovers']} failover(s) to spares" if summary.get("failovers")
            else f"{summary.get('restarts', 0)} restart(s) of every rank")
    return (f"failover            {kind}; recovery {f('recovery_s')} s (detection "
            f"{f('detection_s')}, rewiring {f('rewiring_s')}, restart {f('restart_s')}); "
            f"iteration {f('iteration_time_before_s')} s before, "
            f"{f('iteration_time_after_s')} s after; after resumption "
            f"{summary['calls_after_resume']}/{summary['calls_after_resume_expected']} calls, "
            f"{'all bytes delivered' if summary['after_resume_delivered'] else 'BYTES MISSING'}")


def _throughput_text(summary: dict[str, Any]) -> str:
    """The collectives' rates against the link rate, or ``unrated`` when no call was long
    enough to rate (the sim backend's runs are not rated either: a modelled network). A
    simulation's rate is the modelled one: the rail's under ``fabric``, the emulator's scaled
    link under ``emulator``."""
    if summary.get("costs") == "fabric":
        link = f"the modelled {summary['link_mbps'] / 1e3:g} Gbit/s rail"
    elif summary.get("costs") == "emulator":
        link = f"the modelled emulator link, {summary['link_mbps']:g} Mbit/s"
    else:
        link = f"the configured {summary['link_mbps']:g} Mbit/s"
    median = summary.get("throughput_ratio_median")
    if median is None:
        return f"unrated: no ring collective long enough to rate against {link}"
    p10 = summary.get("throughput_ratio_p10")
    tail = "" if p10 is None else f", p10 {p10:.2f}"
    rated = summary.get("throughput_rated_calls")
    calls = "" if rated is None else f" over {rated} calls"
    return f"median {median:.2f}{tail} of {link}{calls}"


def _fidelity_text(summary: dict[str, Any]) -> str:
    """The verdict, whom it blames and why: ``degraded (blamed on the machine): ...``, and
    the checks that had nothing to judge: ``ok; unrated: throughput ...``."""
    fidelity = summary["fidelity"]
    if fidelity == "simulated":
        return "simulated (a virtual clock: nothing to judge)"
    reasons = summary.get("fidelity_reasons") or []
    text = str(fidelity)
    if reasons:
        text = (f"{fidelity} (blamed on the {summary.get('fidelity_blame', 'run')}): "
                + "; ".join(reasons))
    unrated = summary.get("fidelity_unrated") or []
    if unrated:
        text += "; unrated: " + "; ".join(unrated)
    return text
