"""Compare the structure of emulated runs with and without ``run.start_gate``.

    python scripts/gate_compare.py RUN_DIR [RUN_DIR ...]

Per run (from ``summary.json``, ``controller-events.jsonl`` and ``ranks/*.jsonl``): the
iteration times, the switches per iteration and their order (rail, circuits added and removed),
the circuits lit at the end, how far apart the ranks start and end each iteration, and where
a measured iteration's time goes on the critical rank (waiting for acks against moving bytes).
Structure, not timing: the machine's load moves the times, not the decisions.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def analyse(run: Path) -> dict[str, Any]:
    summary = json.loads((run / "summary.json").read_text())
    events = _jsonl(run / "controller-events.jsonl")
    records = [r for p in sorted((run / "ranks").glob("rank*.jsonl")) for r in _jsonl(p)]
    its = [r for r in records if r.get("ev") == "iteration"]
    ends: dict[int, float] = defaultdict(float)
    for r in its:
        ends[r["it"]] = max(ends[r["it"]], r["t_end"])
    bounds = sorted(ends.items())

    def it_of(t: float) -> int:
        for it, end in bounds:
            if t <= end:
                return it
        return len(bounds)

    switches = [e for e in events if e["event"] == "reconfig_start"]
    per_it: dict[int, list[str]] = defaultdict(list)
    lit: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for e in switches:
        per_it[it_of(e["t_s"])].append(
            f"r{e['rail']}+{[tuple(c) for c in e['add']]}-{[tuple(c) for c in e['remove']]}")
        for c in e["remove"]:
            lit[e["rail"]].discard(tuple(c))
        for c in e["add"]:
            lit[e["rail"]].add(tuple(c))
    spread = {}
    for it, _ in bounds:
        rows = [r for r in its if r["it"] == it]
        spread[it] = (max(r["t_start"] for r in rows) - min(r["t_start"] for r in rows),
                      max(r["t_end"] for r in rows) - min(r["t_end"] for r in rows))
    calls = [r for r in records if r.get("ev") == "call"]
    wait: dict[int, float] = defaultdict(float)  # per iteration: sum over calls of ack waits
    for c in calls:
        wait[c["it"]] += c["t_ack"] - c["t_intent"]
    started = [r["t"] for r in records if r.get("ev") == "started"]
    first_intent: dict[int, float] = {}
    for c in calls:
        first_intent[c["rank"]] = min(first_intent.get(c["rank"], c["t_intent"]), c["t_intent"])
    plans = {int(p.name[4:-10]): json.loads(p.read_text())
             for p in (run / "ranks").glob("rank*.plan.json")}
    rails = _rails(events)
    measured = {it for it, _ in bounds if it >= summary["warmup"]}
    # each rail's start of the first measured iteration, against the earliest rail's
    first_m = min(measured)
    rail_start = {rail: min(r["t_start"] for r in its if r["it"] == first_m
                            and r["rank"] in ranks) for rail, ranks in rails.items()}
    t0 = min(rail_start.values())
    # transfers: a call's span after its ack, per rail (measured iterations)
    stretch, spans = [], defaultdict(list)
    for c in calls:
        if c["it"] not in measured:
            continue
        spans[_rail_of(rails, c["rank"])].append((c["t_ack"], c["t_end"]))
        ideal = c["wire_bytes"] and c["sent"] / (summary["link_mbps"] * 1e6 / 8)
        if ideal and ideal > 0.02:
            stretch.append((c["t_end"] - c["t_ack"]) / ideal)
    over = []
    for r in records:
        if r.get("ev") == "compute" and r["it"] in measured:
            planned = next(o["duration_s"] for o in plans[r["rank"]]["ops"] if o["i"] == r["i"])
            over.append(r["t_end"] - r["t_start"] - planned)
    stretch.sort()
    over.sort()
    return {"run": run.name,
            "rail_offsets_s": {k: round(v - t0, 3) for k, v in sorted(rail_start.items())},
            "transfer_stretch_p50_p90": (_q(stretch, .5), _q(stretch, .9)),
            "compute_overshoot_ms_p50_p90": (1e3 * _q(over, .5), 1e3 * _q(over, .9)),
            "cross_rail_busy_overlap": _overlap(spans),
            "iteration_times_s": summary["iteration_times_s"],
            "it0_s": bounds[0][1] - min(r["t_start"] for r in its if r["it"] == 0),
            "exposed_s": summary["exposed_reconfig_s"],
            "switches_per_it": {it: len(v) for it, v in sorted(per_it.items())},
            "switch_order": dict(per_it),
            "lit": {rail: sorted(c) for rail, c in sorted(lit.items())},
            "start_end_spread_s": spread,
            "started_spread_s": max(started) - min(started),
            "first_intent_spread_s": max(first_intent.values()) - min(first_intent.values()),
            "ack_wait_sum_s": dict(sorted(wait.items())),
            "gate": summary.get("start_gate"),
            "dark_error_ms": summary.get("dark_error_ms"), "cpu": summary.get("cpu")}


def _rails(events: list[dict[str, Any]]) -> dict[int, set[int]]:
    """Connected components of the comm groups: here, one per rail (no scale-up ops)."""
    groups: dict[str, set[int]] = defaultdict(set)
    for e in events:
        if e["event"] == "intent":
            groups[e["group"]].add(e["rank"])
    comps: list[set[int]] = []
    for members in groups.values():
        joined = [c for c in comps if c & members]
        merged = set(members).union(*joined)
        comps = [c for c in comps if not c & members] + [merged]
    return {min(c) : c for c in comps}


def _rail_of(rails: dict[int, set[int]], rank: int) -> int:
    return next(k for k, v in rails.items() if rank in v)


def _q(xs: list[float], q: float) -> float:
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else float("nan")


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(spans: dict[int, list[tuple[float, float]]]) -> float:
    """Of the time some rail moves bytes, the share during which two or more rails do."""
    edges = []
    for iv in spans.values():
        for a, b in _union(iv):
            edges += [(a, 1), (b, -1)]
    edges.sort()
    busy = multi = 0.0
    depth, last = 0, None
    for t, d in edges:
        if last is not None and depth >= 1:
            busy += t - last
            if depth >= 2:
                multi += t - last
        depth += d
        last = t
    return round(multi / busy, 3) if busy else float("nan")


def main(argv: list[str]) -> None:
    rows = [analyse(Path(a)) for a in argv]
    for a in rows:
        print(f"{a['run']}: its {[round(t, 3) for t in a['iteration_times_s']]} "
              f"it0 {a['it0_s']:.3f} exposed {a['exposed_s']} "
              f"switches/it {a['switches_per_it']} started spread {a['started_spread_s']:.3f} "
              f"first intent spread {a['first_intent_spread_s']:.3f}")
        print("   start/end spread per it", {k: (round(v[0], 3), round(v[1], 3))
                                             for k, v in a["start_end_spread_s"].items()})
        print(f"   rail offsets {a['rail_offsets_s']} transfer stretch p50/p90 "
              f"{a['transfer_stretch_p50_p90']} compute overshoot ms p50/p90 "
              f"{tuple(round(x, 2) for x in a['compute_overshoot_ms_p50_p90'])} "
              f"cross-rail transfer overlap {a['cross_rail_busy_overlap']}")
        print("   ack wait sum per it", {k: round(v, 3) for k, v in a["ack_wait_sum_s"].items()})
    base = rows[0]
    for a in rows[1:]:
        print(f"{a['run']} vs {base['run']}: same final circuits {a['lit'] == base['lit']}, "
              f"same switch order {a['switch_order'] == base['switch_order']}")


if __name__ == "__main__":
    main(sys.argv[1:])
