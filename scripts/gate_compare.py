"""Compare the structure of emulated runs with and without ``run.start_gate``.

    .venv/bin/python scripts/gate_compare.py RUN_DIR [RUN_DIR ...]

Per run, from ``summary.json``, ``controller-events.jsonl`` and ``ranks/*.jsonl``:

* decisions: switches per iteration, and whether the switches of each iteration (as a set) and
  the circuits lit at the end are those of the first run given;
* the jobs: the comm groups' connected components (in ``examples/demo.yaml`` one per rail: its
  TP collectives are scale-up, not replayed, so the four rails are four independent jobs), each
  one's iteration times (its last rank's end to its last rank's end) and its offset at the
  first measured iteration; ``excess``: the summary's iteration time (the last rank of all)
  minus the mean of the components' own;
* collisions between components in the measured iterations: during a transfer (a call from
  its ack to its end), how many other components transfer (mean); how much longer transfers
  are per other component transferring (least-squares slope of time / ideal); the share of
  calls whose last member's intent came within 5 ms of another component's intent, and that
  member's ack round trip (ms, median and mean) with and without such a neighbour.

Structure, not timing: the load of a shared machine moves the times, not the decisions, and
the collision figures compare calls within one run.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean, median
from typing import Any

NEAR_S = 0.005
MIN_IDEAL_S = 0.02


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def components(events: list[dict[str, Any]]) -> dict[int, frozenset[int]]:
    """Connected components of the comm groups named by the intents, by their lowest rank."""
    comps: list[set[int]] = []
    groups: dict[str, set[int]] = defaultdict(set)
    for e in events:
        if e["event"] == "intent":
            groups[e["group"]].add(int(e["rank"]))
    for members in groups.values():
        joined = [c for c in comps if c & members]
        comps = [c for c in comps if not c & members] + [set(members).union(*joined)]
    return {min(c): frozenset(c) for c in comps}


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _slope(points: list[tuple[float, float]]) -> float:
    mx, my = mean(p[0] for p in points), mean(p[1] for p in points)
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def _stat(xs: list[float]) -> str:
    return f"{median(xs):.2f}/{mean(xs):.2f} (n={len(xs)})" if xs else "-"


def analyse(run: Path) -> dict[str, Any]:
    summary = json.loads((run / "summary.json").read_text())
    events = _jsonl(run / "controller-events.jsonl")
    records = [r for p in sorted((run / "ranks").glob("rank*.jsonl")) for r in _jsonl(p)]
    comps = components(events)
    comp_of = {rank: c for c, ranks in comps.items() for rank in ranks}
    its = [r for r in records if r.get("ev") == "iteration"]
    n_its = max(r["it"] for r in its) + 1
    end = [max(r["t_end"] for r in its if r["it"] == it) for it in range(n_its)]
    measured = range(summary["warmup"], n_its)
    comp_end = {c: [max(r["t_end"] for r in its if r["it"] == it and r["rank"] in ranks)
                    for it in range(n_its)] for c, ranks in comps.items()}
    comp_times = {c: [e[it] - e[it - 1] for it in measured] for c, e in comp_end.items()}
    first = {c: min(r["t_start"] for r in its if r["it"] == measured[0] and r["rank"] in ranks)
             for c, ranks in comps.items()}
    switches: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    lit: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for e in events:
        if e["event"] != "reconfig_start":
            continue
        it = next((i for i, t in enumerate(end) if e["t_s"] <= t), n_its)
        switches[it].append((e["rail"], tuple(map(tuple, e["add"])),
                             tuple(map(tuple, e["remove"]))))
        lit[e["rail"]] -= {tuple(c) for c in e["remove"]}
        lit[e["rail"]] |= {tuple(c) for c in e["add"]}
    calls = [r for r in records if r.get("ev") == "call" and r["it"] in measured]
    busy: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for c in calls:
        busy[comp_of[c["rank"]]].append((c["t_ack"], c["t_end"]))
    busy_u = {k: _union(v) for k, v in busy.items()}
    rate_bps = summary["link_mbps"] * 1e6 / 8
    transfers = []
    for c in calls:
        ideal, (a, b) = c["sent"] / rate_bps, (c["t_ack"], c["t_end"])
        if ideal >= MIN_IDEAL_S:
            others = sum(max(0.0, min(b, y) - max(a, x)) for k, iv in busy_u.items()
                         if k != comp_of[c["rank"]] for x, y in iv) / (b - a)
            transfers.append((others, (b - a) / ideal))
    last: dict[tuple[int, str], dict[str, Any]] = {}
    for c in calls:
        key = (c["it"], c["cid"])
        if key not in last or c["t_intent"] > last[key]["t_intent"]:
            last[key] = c
    intents = sorted((c["t_intent"], comp_of[c["rank"]]) for c in calls)
    rtt: dict[bool, list[float]] = {False: [], True: []}
    for c in last.values():
        near = any(k != comp_of[c["rank"]] and abs(t - c["t_intent"]) < NEAR_S
                   for t, k in intents)
        rtt[near].append(1e3 * (c["t_ack"] - c["t_intent"]))
    t0 = min(first.values())
    return {"run": run.name, "iteration_times_s": summary["iteration_times_s"],
            "mean_s": summary["iteration_time_s"], "gate": summary.get("start_gate"),
            "components": len(comps), "component_times_s": comp_times,
            "excess_s": summary["iteration_time_s"] - mean(
                mean(v) for v in comp_times.values()),
            "offsets_s": {c: first[c] - t0 for c in sorted(first)},
            "switches": {it: sorted(v) for it, v in sorted(switches.items())},
            "lit": {r: sorted(c) for r, c in sorted(lit.items())},
            "transfer_others": mean(p[0] for p in transfers),
            "transfer_slope": _slope(transfers), "rtt_ms": rtt,
            "ack_collided": len(rtt[True]) / len(last)}


def report(a: dict[str, Any], base: dict[str, Any]) -> str:
    times = ", ".join(f"{t:.3f}" for t in a["iteration_times_s"])
    comp = "; ".join(f"{c}: " + ", ".join(f"{t:.3f}" for t in v)
                     for c, v in a["component_times_s"].items())
    gate = a["gate"]
    return "\n".join([
        f"{a['run']}: iterations {times} (mean {a['mean_s']:.4f}); gate "
        + (f"skew {1e3 * gate['release_skew_s']:.1f} ms, early {gate['ranks_started_early']}"
           if gate else "off"),
        f"  switches per iteration {[len(v) for v in a['switches'].values()]} "
        f"(iterations {list(a['switches'])}); same switches per iteration as {base['run']}: "
        f"{a['switches'] == base['switches']}, same circuits lit at the end: "
        f"{a['lit'] == base['lit']}",
        f"  {a['components']} independent jobs, own iteration times {comp}; excess of the "
        f"summary's time {1e3 * a['excess_s']:+.1f} ms; offsets at the first measured "
        "iteration " + ", ".join(f"{1e3 * v:.0f}" for v in a["offsets_s"].values()) + " ms",
        f"  transfers: other jobs transferring {a['transfer_others']:.2f} on average, "
        f"{100 * a['transfer_slope']:+.1f} % time per other job; last joiner's ack ms "
        f"median/mean alone {_stat(a['rtt_ms'][False])}, beside another job's intent "
        f"{_stat(a['rtt_ms'][True])}: {100 * a['ack_collided']:.0f} % of calls"])


def main(argv: list[str]) -> None:
    rows = [analyse(Path(a)) for a in argv]
    for a in rows:
        print(report(a, rows[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
