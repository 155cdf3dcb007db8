"""Failover metrics of a run, from the controller's event log and the ranks' records (pure).

One row per recovery (a ``ranks_resumed`` event: a spare took a failed rank over, or every rank
restarted). Times are the run's clock (wall clock on the emulator, virtual on the sim backend):

* ``t_fail_s``: the fault that took the rank out (the first ``fault`` event after the previous
  resumption, e.g. the kill, the cut link, the failed OCS port); without one (an unplanned crash)
  the detection time;
* ``t_detect_s``: ``failure_detected`` (the runner saw the process exit, or the controller's
  heartbeats stopped);
* ``t_resume_s``: ``ranks_resumed`` (the job is registered again and every rank told to go on);
* ``t_first_s``: the end of the first collective completed after the resumption in which the
  failed rank (now on its spare) took part (``collective_done`` of the new job's first call of a
  group with that rank);
* ``recovery_s = t_first - t_fail``, split into ``detection_s = t_detect - t_fail``,
  ``rewiring_s`` (the union of the dark periods of the new job's reconfigurations that touched
  the rank's new ports, between resumption and ``t_first``: the circuits moving to the spare) and
  ``restart_s`` (the rest: abandoning the iteration, re-registering, the spare taking over,
  the ranks reconnecting, the compute before the first collective and its transfer);
* a ``ranks_resumed`` of policy ``in_place`` (a rank too starved of CPU to send heartbeats, but
  running: the epoch was redone on the same hosts) is a row too, counted apart from failovers.
* ``heartbeat_s``: when the heartbeats alone would have told (``heartbeat_lost`` of the failed
  rank), after the fault; None if the run ended first.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from testbed.metrics.compute import Record, _union_length, final_records

FAILURE_FAULTS = ("kill", "link_down", "hang", "port_failed", "nic_down")


def failover_table(events: Sequence[Record], members: Mapping[str, Sequence[int]]
                   ) -> list[dict[str, Any]]:
    """One row per recovery (see the module docstring); ``members``: group id -> ranks."""
    rows = []
    prev_resume = -math.inf
    evs = sorted(events, key=lambda e: float(e["t_s"]))
    for i, resumed in enumerate(evs):
        if resumed.get("event") != "ranks_resumed":
            continue
        t_resume = float(resumed["t_s"])
        rank, job = int(resumed["rank"]), str(resumed["job"])
        detected = [e for e in evs[:i] if e.get("event") == "failure_detected"
                    and float(e["t_s"]) > prev_resume]
        t_detect = float(detected[-1]["t_s"]) if detected else t_resume
        faults = [e for e in evs[:i] if e.get("event") == "fault"
                  and e.get("kind") in FAILURE_FAULTS and prev_resume < float(e["t_s"]) <= t_detect]
        t_fail = float(faults[0]["t_s"]) if faults else t_detect
        assigned = [e for e in evs[:i] if e.get("event") == "spare_assigned"
                    and float(e["t_s"]) > prev_resume and int(e["rank"]) == rank]
        new_ports = set(assigned[-1]["new_ports"]) if assigned else set()
        rail = int(assigned[-1]["rail"]) if assigned else None
        t_first = _first_done(evs[i:], job, rank, members)
        rewiring = 0.0
        if t_first is not None and new_ports:
            rewiring = _union_length(_dark_spans(evs[i:], job, rail, new_ports, t_resume,
                                                 t_first))
        lost = [e for e in evs if e.get("event") == "heartbeat_lost"
                and int(e.get("rank", -1)) == rank and float(e["t_s"]) >= t_fail
                and e.get("job") != job]
        recovery = (t_first - t_fail) if t_first is not None else None
        detection = t_detect - t_fail
        rows.append({
            "rank": rank, "policy": resumed.get("policy", "spares"),
            "host": resumed.get("host"), "epoch": resumed.get("epoch"), "job": job,
            "start_iteration": resumed.get("start_iteration"),
            "via": detected[-1].get("via") if detected else None,
            "fault": faults[0].get("kind") if faults else None,
            "t_fail_s": t_fail, "t_detect_s": t_detect, "t_resume_s": t_resume,
            "t_first_s": t_first, "recovery_s": recovery, "detection_s": detection,
            "rewiring_s": rewiring,
            "restart_s": recovery - detection - rewiring if recovery is not None else None,
            "heartbeat_s": float(lost[0]["t_s"]) - t_fail if lost else None,
            "same_server": assigned[-1].get("same_server") if assigned else None,
            "rail": rail, "new_ports": " ".join(str(p) for p in sorted(new_ports)),
        })
        prev_resume = t_resume
    return rows


def _first_done(evs: Sequence[Record], job: str, rank: int,
                members: Mapping[str, Sequence[int]]) -> float | None:
    for e in evs:
        if (e.get("event") == "collective_done" and e.get("job") == job
                and rank in members.get(str(e["group"]), ())):
            return float(e["t_s"])
    return None


def _dark_spans(evs: Sequence[Record], job: str, rail: int | None, ports: set[int],
                t0: float, t1: float) -> list[tuple[float, float]]:
    """Dark periods of ``job``'s switches touching ``ports`` on ``rail``, within [t0, t1]."""
    decisions = {int(e["decision"]) for e in evs if e.get("event") == "decision"
                 and e.get("job") == job}
    touching = {int(e["decision"]) for e in evs if e.get("event") == "reconfig_start"
                and int(e["decision"]) in decisions and e.get("rail") == rail
                and ports & set(e.get("ports", []))}
    spans = []
    for e in evs:
        if (e.get("event") == "reconfig_end" and int(e["decision"]) in touching
                and e.get("rail") == rail and e.get("t_dark_s") is not None):
            a, b = max(float(e["t_dark_s"]), t0), min(float(e["t_light_s"]), t1)
            if b > a:
                spans.append((a, b))
    return spans


def failover_summary(rows: Sequence[Mapping[str, Any]], iterations: Sequence[Mapping[str, Any]],
                     records: Sequence[Record], calls_per_iteration: Mapping[int, int],
                     total_iterations: int) -> dict[str, Any]:
    """The summary's failover keys: counts, medians of the split, iteration time before and
    after, and whether every collective after the (last) resumption delivered every byte."""
    # a resumption in place (heartbeats missed by a running rank) moved no rank: not a recovery
    # from a failure, counted apart
    done = [r for r in rows if r["recovery_s"] is not None and r["policy"] != "in_place"]

    def med(key: str) -> float | None:
        vals = [float(r[key]) for r in done if r[key] is not None]
        return statistics.median(vals) if vals else None

    first_fail = min((float(r["t_fail_s"]) for r in rows), default=None)
    last_first = max((float(r["t_first_s"]) for r in done), default=None)
    measured = [r for r in iterations if r.get("measured") in (True, "True")]
    before = [float(r["iteration_time_s"]) for r in measured
              if first_fail is not None and float(r["t_end_s"]) <= first_fail]
    after = [float(r["iteration_time_s"]) for r in measured
             if last_first is not None and float(r["t_start_s"]) >= last_first]
    spans = [(float(r["t_fail_s"]), float(r["t_first_s"] or math.inf)) for r in rows]
    hit = [float(r["iteration_time_s"]) for r in iterations
           if any(float(r["t_start_s"]) < b and float(r["t_end_s"]) > a for a, b in spans)]
    # every iteration from the first resumption on, as its last attempt ran it
    first_start = min((int(r["start_iteration"]) for r in rows), default=total_iterations)
    after_calls = [c for c in final_records(records, "call") if int(c["it"]) >= first_start]
    expected_calls = sum(calls_per_iteration.values()) * (total_iterations - first_start)
    return {
        "failovers": sum(1 for r in rows if r["policy"] == "spares"),
        "restarts": sum(1 for r in rows if r["policy"] == "restart"),
        "resumes_in_place": sum(1 for r in rows if r["policy"] == "in_place"),
        "recovery_s": med("recovery_s"), "detection_s": med("detection_s"),
        "rewiring_s": med("rewiring_s"), "restart_s": med("restart_s"),
        "heartbeat_detection_s": med("heartbeat_s"),
        "iteration_time_before_s": statistics.mean(before) if before else None,
        "iteration_time_after_s": statistics.mean(after) if after else None,
        "recovery_iteration_times_s": hit,
        "calls_after_resume": len(after_calls),
        "calls_after_resume_expected": expected_calls,
        "bytes_after_resume_expected": sum(int(c["expected"]) for c in after_calls),
        "bytes_after_resume_received": sum(int(c["received"]) for c in after_calls),
        "after_resume_delivered": bool(rows) and len(after_calls) == expected_calls
        and all(int(c["received"]) == int(c["expected"]) for c in after_calls),
        "recovery": [dict(r) for r in rows],
    }
