"""Metrics of a run, from the ranks' records and the controller's event log (pure).

Definitions (times are seconds of the run's clock: the wall clock, shared by every namespace
of the machine, for emulated runs; the virtual clock for simulated ones):

* **iteration time**: iteration ``i`` ends when its last rank finishes it; its time is the end
  of ``i`` minus the end of ``i - 1`` (the first one runs from the first rank's start). The
  mean is over the measured iterations (after the warm-up). After a failover a rank runs some
  iterations again in a new epoch (records carry ``epoch``); its last epoch's record counts.
* **exposed reconfiguration**: for every call instance (comm group, sequence number) the time
  from its last member's intent to its first ack, when positive: the collective was ready but
  its circuits were not. The union of these intervals, per measured iteration, is the time
  during which at least one collective waited on light (controller round trips included).
* **windows** (paper §3.1): per rank, consecutive calls of the same parallelism axis and
  collective kind form a phase; a window is the start of a phase minus the end of the previous
  phase when their comm-group sets differ: ``min(start of P2's calls) - max(end of P1's
  calls)``. A call starts when its slowest member joins (the latest intent of its members)
  and ends when the rank's bytes have been delivered. Windows are the gaps the *workload*
  offers: they are measured on the electrical baseline (``mode: baseline``), where no call
  waits for light. The same gaps measured on a switched run include its waits for light (a
  call whose circuits are late ends late, and so do the phases after it); they are kept apart
  as **gaps** (``gaps.csv``, ``gaps*`` keys), never as windows.
* **throughput**: bytes a rank sent in a ring collective from the moment its last member was
  acknowledged to the rank's end of the call, against the configured link rate; only calls
  whose ideal transfer takes at least ``min_transfer_s`` count. Calls run as several segments
  (one Opus call each, :mod:`testbed.plan.replay`) are not rated: their span includes the
  switching between segments.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.stats import percentile
from workloads.layout import AXIS_FAMILY
from workloads.phases import KIND_FAMILY

Record = Mapping[str, Any]

VOLUME_BINS = ((1 << 20, "< 1 MiB"), (64 << 20, "1-64 MiB"), (1 << 30, "64 MiB-1 GiB"),
               (math.inf, ">= 1 GiB"))


@dataclass
class RunMetrics:
    """Everything computed from one run; tables are lists of flat dicts (CSV rows)."""

    iterations: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)
    circuits: list[dict[str, Any]] = field(default_factory=list)
    rails: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            if cur_b is not None and cur_a is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_a is not None and cur_b is not None:
        total += cur_b - cur_a
    return total


def final_records(records: Sequence[Record], ev: str) -> list[Record]:
    """Records of kind ``ev`` from each rank's last attempt at each iteration (highest epoch)."""
    last: dict[tuple[int, int], int] = {}
    chosen = [r for r in records if r.get("ev") == ev]
    for r in chosen:
        key = (int(r["rank"]), int(r["it"]))
        last[key] = max(last.get(key, 0), int(r.get("epoch", 0)))
    return [r for r in chosen if int(r.get("epoch", 0)) == last[(int(r["rank"]), int(r["it"]))]]


def iteration_table(records: Sequence[Record], warmup: int) -> list[dict[str, Any]]:
    """One row per iteration: start, end, time, whether it is measured."""
    ends: dict[int, float] = {}
    starts: dict[int, float] = {}
    ranks: dict[int, int] = defaultdict(int)
    for r in final_records(records, "iteration"):
        it = int(r["it"])
        ends[it] = max(ends.get(it, -math.inf), float(r["t_end"]))
        starts[it] = min(starts.get(it, math.inf), float(r["t_start"]))
        ranks[it] += 1
    rows = []
    prev_end: float | None = None
    for it in sorted(ends):
        begin = starts[it] if prev_end is None else prev_end
        rows.append({"iteration": it, "t_start_s": begin, "t_end_s": ends[it],
                     "iteration_time_s": ends[it] - begin, "ranks": ranks[it],
                     "measured": it >= warmup})
        prev_end = ends[it]
    return rows


def measured_span(records: Sequence[Record], warmup: int) -> tuple[float, float]:
    """(start, end) of the measured iterations (after the warm-up) on the run's clock; an
    empty span (inf, -inf) when none completed."""
    measured = [row for row in iteration_table(records, warmup) if row["measured"]]
    if not measured:
        return (math.inf, -math.inf)
    return (float(measured[0]["t_start_s"]), float(measured[-1]["t_end_s"]))


def exposed_intervals(events: Sequence[Record]) -> list[tuple[float, float, str, int]]:
    """(ready, first ack, group, seq) of call instances whose ack came after the last intent
    (instances are per job: a failover registers the job again, and call numbers restart)."""
    last_intent: dict[tuple[str, str, int], float] = {}
    first_ack: dict[tuple[str, str, int], float] = {}
    for e in events:
        kind = e.get("event")
        if kind == "intent":
            key = (str(e.get("job", "")), str(e["group"]), int(e["seq"]))
            last_intent[key] = max(last_intent.get(key, -math.inf), float(e["t_s"]))
        elif kind == "ack":
            key = (str(e.get("job", "")), str(e["group"]), int(e["seq"]))
            first_ack[key] = min(first_ack.get(key, math.inf), float(e["t_s"]))
    out = []
    for key, t_ack in first_ack.items():
        t_ready = last_intent.get(key)
        if t_ready is not None and t_ack > t_ready:
            out.append((t_ready, t_ack, key[1], key[2]))
    return out


def call_table(records: Sequence[Record], link_mbps: float, scale: float
               ) -> list[dict[str, Any]]:
    """One row per rank's call, with its wait, duration and achieved rate."""
    all_acked: dict[tuple[int, int, str], float] = {}
    for r in records:
        if r.get("ev") == "call":
            key = (int(r.get("epoch", 0)), int(r["it"]), str(r["cid"]))
            all_acked[key] = max(all_acked.get(key, -math.inf), float(r["t_ack"]))
    rows = []
    final = {id(r) for r in final_records(records, "call")}
    for r in records:
        if r.get("ev") != "call":
            continue
        dur = float(r["t_end"]) - float(r["t_ack"])
        # the bytes can only flow once every member is in: rate over that span (ring
        # collectives; a send/recv pair's two calls need not overlap, so they are not rated,
        # nor are calls whose segments wait for circuits in between)
        segments = int(r.get("segments", 1))
        ring = str(r["kind"]) not in ("send", "recv") and segments == 1
        data_s = float(r["t_end"]) - all_acked[(int(r.get("epoch", 0)), int(r["it"]),
                                                 str(r["cid"]))]
        sent = int(r["sent"])
        ideal_s = sent * 8 / (link_mbps * 1e6) if link_mbps > 0 else 0.0
        rows.append({
            "rank": r["rank"], "iteration": r["it"], "op": r["i"], "group": r["lane"],
            "kind": r["kind"], "axis": r["axis"], "collective": r["cid"], "seq": r["seq"],
            "reconfigured": r["reconfigured"], "t_intent_s": r["t_intent"],
            "t_ack_s": r["t_ack"], "t_end_s": r["t_end"],
            "wait_s": float(r["t_ack"]) - float(r["t_intent"]), "duration_s": dur,
            "size_bytes": r["size_bytes"], "wire_bytes": r["wire_bytes"],
            "sent_bytes_scaled": sent, "received_bytes_scaled": r["received"],
            "expected_bytes_scaled": r["expected"],
            "delivered": int(r["received"]) == int(r["expected"]),
            "ideal_transfer_s": ideal_s if ring else 0.0,
            "achieved_mbps": sent * 8 / data_s / 1e6 if data_s > 0 and sent else 0.0,
            "configured_mbps": link_mbps,
            "real_gbps_equivalent": (sent * 8 / dur / 1e9 / scale) if dur > 0 and sent else 0.0,
            "segments": segments,
            "segment_wait_s": float(r.get("segment_wait_s",
                                          float(r["t_ack"]) - float(r["t_intent"]))),
            "verified": r.get("verified", ""),
            "epoch": int(r.get("epoch", 0)), "superseded": id(r) not in final,
        })
    return rows


def window_table(calls: Sequence[Mapping[str, Any]], warmup: int) -> list[dict[str, Any]]:
    """Windows between phases of each rank in the measured iterations (paper §3.1; see the
    module docstring): on a baseline run its windows, on a switched run its gaps."""
    by_rank: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    joined: dict[tuple[int, int, str], float] = {}  # a call starts when its last member joins
    for c in calls:
        if int(c["iteration"]) >= warmup and c.get("superseded") in (None, False, "False"):
            by_rank[int(c["rank"])].append(c)
            key = _instance(c)
            joined[key] = max(joined.get(key, -math.inf), float(c["t_intent_s"]))
    rows = []
    for rank, cs in sorted(by_rank.items()):
        cs.sort(key=lambda c: float(c["t_ack_s"]))
        phases: list[dict[str, Any]] = []
        for c in cs:
            phase_key = (AXIS_FAMILY.get(str(c["axis"]), str(c["axis"])),
                         KIND_FAMILY.get(str(c["kind"]), str(c["kind"])))
            start = joined[_instance(c)]
            if not phases or phases[-1]["key"] != phase_key:
                phases.append({"key": phase_key, "groups": set(), "axes": [], "start": start,
                               "end": float(c["t_end_s"]), "bytes": 0})
            ph = phases[-1]
            ph["groups"].add(c["group"])
            if str(c["axis"]) not in ph["axes"]:
                ph["axes"].append(str(c["axis"]))
            ph["start"] = min(ph["start"], start)
            ph["end"] = max(ph["end"], float(c["t_end_s"]))
            ph["bytes"] += int(c["size_bytes"])
        for a, b in itertools.pairwise(phases):
            if a["groups"] == b["groups"]:
                continue
            rows.append({"rank": rank, "from": _phase_label(a), "to": _phase_label(b),
                         "window_s": b["start"] - a["end"], "t_s": a["end"],
                         "next_bytes": b["bytes"], "volume_bin": volume_bin(b["bytes"])})
    return rows


def _phase_label(phase: Mapping[str, Any]) -> str:
    """``fsdp/allgather``: the phase's group axes (FSDP's calls as fsdp, though the phase is
    split on the paper-level axis, dp) and its kind."""
    return f"{'+'.join(phase['axes'])}/{phase['key'][1]}"


def _instance(call: Mapping[str, Any]) -> tuple[int, int, str]:
    """A call instance shared by its members: (epoch, iteration, collective id)."""
    return (int(call.get("epoch", 0)), int(call["iteration"]), str(call["collective"]))


#: The summary keys of :func:`window_figures`, per prefix: count, share over 1 ms, median,
#: empty count, share at least the switching delay.
WINDOW_KEYS = {
    "windows": ("windows", "windows_over_1ms_pct", "window_median_s", "windows_empty",
                "windows_at_least_delay_pct"),
    "gaps": ("gaps", "gaps_over_1ms_pct", "gap_median_s", "gaps_empty",
             "gaps_at_least_delay_pct")}


def window_figures(windows: Sequence[Mapping[str, Any]], prefix: str = "windows",
                   delay_ms: float | None = None) -> dict[str, Any]:
    """Count, share over 1 ms, median and empty (<= 0) count of ``windows`` (rows with
    ``window_s``) under the keys of ``prefix`` (:data:`WINDOW_KEYS`: ``windows`` or
    ``gaps``); with ``delay_ms`` (> 0) also the share at least that long."""
    wins = [float(w["window_s"]) for w in windows]
    count, over_1ms, median, empty, at_least = WINDOW_KEYS[prefix]
    out: dict[str, Any] = {
        count: len(wins),
        over_1ms: 100.0 * sum(1 for w in wins if w > 1e-3) / len(wins) if wins else None,
        median: percentile(wins, 50) if wins else None,
        empty: sum(1 for w in wins if w <= 0.0)}
    if delay_ms:
        out[at_least] = (100.0 * sum(1 for w in wins if w >= delay_ms * 1e-3) / len(wins)
                         if wins else None)
    return out


def volume_bin(size_bytes: int) -> str:
    return next(label for limit, label in VOLUME_BINS if size_bytes < limit)


def circuit_table(events: Sequence[Record]) -> list[dict[str, Any]]:
    """One row per rail reconfiguration: when the rail went dark and lit, what changed."""
    rows = []
    for e in events:
        if e.get("event") == "reconfig_end":
            rows.append({"rail": e["rail"], "decision": e["decision"],
                         "t_dark_s": e.get("t_dark_s"), "t_light_s": e.get("t_light_s"),
                         "dark_ms": e.get("dark_ms"),
                         "added": " ".join(_circuit_text(c) for c in e.get("added", [])),
                         "removed": " ".join(_circuit_text(c) for c in e.get("removed", []))})
    return rows


def _circuit_text(c: Any) -> str:
    if isinstance(c, Mapping):
        return f"{c.get('port_a')}-{c.get('port_b')}"
    return str(c)


def compute_metrics(records: Sequence[Record], events: Sequence[Record], *, warmup: int,
                    link_mbps: float, scale: float, num_rails: int,
                    min_transfer_s: float = 0.05, switched: bool = False) -> RunMetrics:
    """All tables and the summary figures of one run. ``switched`` (a run with an OCS): its
    gaps between phases are reported as ``gaps*``, and its ``windows*`` are left empty (None)
    for the baseline's (:func:`testbed.results.baseline.with_baseline`)."""
    m = RunMetrics()
    m.iterations = iteration_table(records, warmup)
    m.calls = call_table(records, link_mbps, scale)
    m.windows = window_table(m.calls, warmup)
    m.circuits = circuit_table(events)
    measured = [row for row in m.iterations if row["measured"]]
    t0 = measured[0]["t_start_s"] if measured else math.inf
    t1 = measured[-1]["t_end_s"] if measured else -math.inf
    per_rail: dict[int, int] = defaultdict(int)
    per_rail_measured: dict[int, int] = defaultdict(int)
    for row in m.circuits:
        per_rail[int(row["rail"])] += 1
        if row["t_light_s"] is not None and t0 <= float(row["t_light_s"]) <= t1:
            per_rail_measured[int(row["rail"])] += 1
    # rails past the data rails are rail-state shadow rails (one per rail and bit): their
    # reconfigurations are the bit flips (controller.railstate)
    shadow = sorted(r for r in per_rail if r >= num_rails)
    m.rails = [{"rail": r, "role": "data" if r < num_rails else "shadow",
                "reconfigurations": per_rail.get(r, 0),
                "reconfigurations_measured": per_rail_measured.get(r, 0)}
               for r in [*range(num_rails), *shadow]]
    exposed = exposed_intervals(events)
    exposed_per_it = []
    for row in measured:
        a, b = float(row["t_start_s"]), float(row["t_end_s"])
        exposed_per_it.append(_union_length(
            (max(x, a), min(y, b)) for x, y, _g, _s in exposed if y > a and x < b))
    times = [float(row["iteration_time_s"]) for row in measured]
    big = [c for c in m.calls if c["ideal_transfer_s"] >= min_transfer_s]
    ratios = [c["achieved_mbps"] / link_mbps for c in big if link_mbps > 0]
    m.summary = {
        "iteration_time_s": _mean(times),
        "iteration_times_s": times,
        "iterations_completed": len(m.iterations),
        "reconfigurations": sum(per_rail.values()),
        "reconfigurations_per_iteration": (sum(per_rail_measured.values()) / len(measured)
                                           if measured else 0.0),
        "exposed_reconfig_s": _mean(exposed_per_it),
        "calls": len(m.calls),
        "calls_delivered": sum(1 for c in m.calls if c["delivered"]),
        "bytes_expected_scaled": sum(int(c["expected_bytes_scaled"]) for c in m.calls),
        "bytes_received_scaled": sum(int(c["received_bytes_scaled"]) for c in m.calls),
        "throughput_ratio_median": percentile(ratios, 50) if ratios else None,
        "throughput_ratio_p10": percentile(ratios, 10) if ratios else None,
        "throughput_rated_calls": len(ratios),
    }
    if switched:
        m.summary.update(window_figures(m.windows, "gaps"))
        m.summary.update({key: None for key in window_figures([])})
    else:
        m.summary.update(window_figures(m.windows))
    return m


def rail_state_counts(events: Sequence[Record]) -> dict[str, int] | None:
    """Rail-state calls served: in all, acknowledged at once, bits flipped, stale re-flips
    (bits a switch in flight or waiting already took there, flipped again), joined bits (such
    bits whose switch the call waited for instead, ``ocs.rail_state_inflight: join``) and bits
    that waited free behind an earlier request (where the artifact's per-bit threads would not
    wait); None without rail-state events."""
    served = [e for e in events if e.get("event") == "rail_state_served"]
    if not served:
        return None
    joined = [int(e.get("joined_bits", 0)) for e in served]
    return {"served": len(served),
            "acked_at_once": sum(1 for e, j in zip(served, joined, strict=True)
                                 if not e["bits"] and not j),
            "bit_flips": sum(len(e["bits"]) for e in served),
            "stale_reflips": sum(int(e["stale_bits"]) for e in served) - sum(joined),
            "joined_bits": sum(joined),
            "early_bits": sum(int(e.get("early_bits", 0)) for e in served)}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
