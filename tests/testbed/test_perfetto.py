"""``opus-testbed export perfetto``: a run as a trace that Perfetto opens, its spans equal to the
run's records; and the PNG timeline's x range."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from testbed.cli.export import parse_ranks
from testbed.cli.main import main
from testbed.metrics.darktime import controller_switches
from testbed.results import plots, store
from testbed.results.perfetto import RunFacts, check_trace, switches, trace_events

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.yaml"
FAILOVER = ROOT / "examples" / "failover.yaml"


def _trace(path: Path) -> list[dict[str, Any]]:
    events = json.loads(path.read_text())["traceEvents"]
    assert isinstance(events, list)
    return events


def _sim_run(tmp_path: Path, config: Path, name: str, *extra: str) -> Path:
    out = tmp_path / name
    assert main(["run", str(config), "--backend", "sim", "--out", str(out), *extra]) == 0
    return out


def test_a_hand_built_run_exports_to_exactly_the_expected_events() -> None:
    """One compute, one call and one switch: every field of every event, metadata included."""
    facts = RunFacts(name="hand", t0_s=10.0, world_size=2, switching_delay_ms=10.0)
    ranks = [(0, [{"ev": "compute", "rank": 0, "it": 0, "i": 0, "t_start": 10.0,
                   "t_end": 10.002},
                  {"ev": "call", "rank": 0, "it": 0, "i": 1, "lane": "fsdp0",
                   "kind": "all_gather", "axis": "fsdp", "cid": "fsdp0:ag", "seq": 0,
                   "reconfigured": True, "t_intent": 10.002, "t_ack": 10.015, "t_end": 10.02,
                   "sent": 5, "received": 5, "expected": 5, "size_bytes": 1000,
                   "wire_bytes": 1000}])]
    events = [{"event": "reconfig_end", "t_s": 10.013, "decision": 1, "rail": 0,
               "added": [[1, 2]], "removed": [], "t_request_s": 10.003, "t_dark_s": 10.003,
               "t_light_s": 10.013}]

    def meta(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
        return {"name": kind, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}

    expected = [
        meta("process_name", 100, 0, name="OCS rail 0"),
        meta("process_sort_index", 100, 0, sort_index=100),
        meta("thread_name", 100, 1, name="switches"),
        meta("thread_sort_index", 100, 1, sort_index=-1),
        {"name": "switch +1-2", "cat": "switch", "ph": "X", "ts": 3000, "dur": 10000,
         "pid": 100, "tid": 1,
         "args": {"switch": 0, "decisions": [1], "ports": [1, 2], "added": "1-2", "removed": "",
                  "dark_ms": 10.0, "configured_delay_ms": 10.0}},
        {"name": "configured delay 10 ms", "cat": "delay", "ph": "X", "ts": 3000, "dur": 10000,
         "pid": 100, "tid": 1},
        meta("thread_name", 100, 2, name="port 1 (rank 0)"),
        meta("thread_sort_index", 100, 2, sort_index=1),
        {"name": "dark: peer none -> 2", "cat": "dark", "ph": "X", "ts": 3000, "dur": 10000,
         "pid": 100, "tid": 2, "args": {"switch": 0, "from_peer": None, "to_peer": 2}},
        meta("thread_name", 100, 3, name="port 2 (rank 1)"),
        meta("thread_sort_index", 100, 3, sort_index=2),
        {"name": "dark: peer none -> 1", "cat": "dark", "ph": "X", "ts": 3000, "dur": 10000,
         "pid": 100, "tid": 3, "args": {"switch": 0, "from_peer": None, "to_peer": 1}},
        meta("process_name", 10000, 0, name="server 0"),
        meta("process_sort_index", 10000, 0, sort_index=10000),
        meta("thread_name", 10000, 4, name="rank 0"),
        meta("thread_sort_index", 10000, 4, sort_index=0),
        {"name": "compute", "cat": "compute", "ph": "X", "ts": 0, "dur": 2000, "pid": 10000,
         "tid": 4, "args": {"it": 0, "i": 0}},
        meta("thread_name", 10000, 5, name="rank 0 fsdp0"),
        meta("thread_sort_index", 10000, 5, sort_index=10),
        {"name": "wait for ack", "cat": "wait", "ph": "X", "ts": 2000, "dur": 13000,
         "pid": 10000, "tid": 5,
         "args": {"group": "fsdp0", "seq": 0, "reconfigured": True, "wait_ms": 13.0}},
        {"name": "all_gather fsdp0", "cat": "call", "ph": "X", "ts": 15000, "dur": 5000,
         "pid": 10000, "tid": 5,
         "args": {"kind": "all_gather", "group": "fsdp0", "collective": "fsdp0:ag",
                  "axis": "fsdp", "phase": "dp/allgather", "algorithm": "ring",
                  "size_bytes": 1000, "wire_bytes": 1000, "it": 0, "i": 1, "seq": 0,
                  "reconfigured": True, "delivered": True}},
    ]
    got = list(trace_events(facts, ranks, events))
    assert got == expected
    assert check_trace(got) == []


def test_check_trace_finds_what_a_viewer_would_refuse() -> None:
    good = {"name": "a", "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 1}
    assert check_trace([good, {**good, "ts": 2, "dur": 3}]) == []  # nested
    assert check_trace([good, {**good, "ts": 10, "dur": 3}]) == []  # one after the other
    problems = check_trace([
        {"name": "no tid", "ph": "X", "ts": 0, "dur": 1, "pid": 1},
        {**good, "name": "negative", "dur": -1},
        good, {**good, "name": "straddles", "ts": 5, "dur": 10},
        {"name": "b", "ph": "B", "ts": 0, "pid": 1, "tid": 2},
        {**good, "name": "arrow", "tid": 3, "bind_id": 7, "flow_out": True},
    ])
    assert len(problems) == 5, problems
    for needle in ("lacks tid", "dur -1", "'straddles'", "B without E", "arrow 7"):
        assert any(needle in p for p in problems), (needle, problems)


def _counts(events: list[dict[str, Any]], cat: str) -> Counter[Any]:
    """Spans of category ``cat`` per rank (by the name of their track)."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    return Counter(int(names[(e["pid"], e["tid"])].split()[1]) for e in events
                   if e.get("cat") == cat and e["ph"] == "X")


def test_a_simulated_run_exports_a_valid_trace_with_its_records_spans(tmp_path: Path) -> None:
    """``run --perfetto`` and ``export perfetto``: valid, one span per call and compute record of
    each rank, one switch span per switch and one dark span per port it touched, at least as
    many dark periods as reconfigurations; arrows from intents to acks."""
    run = _sim_run(tmp_path, TINY, "tiny", "--mode", "on-demand", "--perfetto")
    assert (run / "trace.json").exists()
    out = tmp_path / "t.json"
    assert main(["export", "perfetto", str(run), "--out", str(out)]) == 0
    events = _trace(out)
    assert events == _trace(run / "trace.json")
    assert check_trace(events) == []
    for e in events:
        assert {"ph", "ts", "pid", "tid"} <= set(e), e

    records = [r for path in sorted((run / "ranks").glob("rank*.jsonl"))
               for r in store.read_jsonl(path)]
    assert _counts(events, "call") == Counter(int(r["rank"]) for r in records
                                              if r.get("ev") == "call")
    assert _counts(events, "compute") == Counter(int(r["rank"]) for r in records
                                                 if r.get("ev") == "compute")
    controller = store.read_jsonl(run / "controller-events.jsonl")
    sws = switches(controller)
    cats = Counter(e.get("cat") for e in events if e["ph"] == "X")
    assert cats["switch"] == len(sws) == controller_switches(controller)
    assert cats["dark"] == sum(len(s.ports) for s in sws)
    summary = json.loads((run / "summary.json").read_text())
    assert cats["dark"] >= summary["reconfigurations"] > 0
    assert cats["intent"] == cats["ack"] == summary["calls"]
    flows = Counter(e["bind_id"] for e in events if "bind_id" in e)
    assert len(flows) >= summary["calls"] and set(flows.values()) <= {2, 3}
    iterations = [e for e in events if e.get("cat") in ("iteration", "warm-up")]
    assert Counter(e["cat"] for e in iterations) == {"warm-up": summary["warmup"],
                                                     "iteration": summary["iterations"]}

    # --ranks: only those ranks' tracks, intents, acks and ports; every switch kept
    part = tmp_path / "part.json"
    assert main(["export", "perfetto", str(run), "--out", str(part), "--ranks", "1-2"]) == 0
    sub = _trace(part)
    assert check_trace(sub) == []
    assert set(_counts(sub, "call")) == {1, 2}
    assert {e["args"]["rank"] for e in sub if e.get("cat") in ("intent", "ack")} == {1, 2}
    assert Counter(e.get("cat") for e in sub)["switch"] == len(sws)


def test_a_failover_run_shows_its_recovery_in_parts(tmp_path: Path) -> None:
    run = _sim_run(tmp_path, FAILOVER, "failover")
    assert main(["export", "perfetto", str(run)]) == 0
    events = _trace(run / "trace.json")
    assert check_trace(events) == []
    rows = store.read_csv(run / "failovers.csv")
    failure = [e for e in events if e.get("cat") == "failure" and e["ph"] == "X"]
    recoveries = [e for e in failure if e["name"].startswith("recovery of rank")]
    assert len(recoveries) == len(rows) >= 1
    names = {e["name"] for e in failure}
    assert {"detection", "restart", "rewiring"} <= names
    rec = recoveries[0]
    for part in (e for e in failure if e is not rec):  # the parts lie inside the recovery
        assert rec["ts"] <= part["ts"] and part["ts"] + part["dur"] <= rec["ts"] + rec["dur"]
    instants = Counter(e["name"] for e in events if e.get("cat") == "failure"
                       and e["ph"] == "i")
    assert instants["fault"] >= 1 and instants["ranks_resumed"] == len(rows)


def test_export_refuses_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    assert main(["export", "perfetto", str(tmp_path)]) == 2


@pytest.mark.parametrize(("text", "ranks"), [("3", {3}), ("0-2,7", {0, 1, 2, 7}),
                                             (" 5 , 1-1", {1, 5})])
def test_rank_lists(text: str, ranks: set[int]) -> None:
    assert parse_ranks(text) == ranks


@pytest.mark.parametrize("text", ["", "3-1", "a", "-2"])
def test_bad_rank_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_ranks(text)


def test_the_png_timeline_ends_at_the_last_activity(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An iteration that ends long after the drawn ranks' last span (another rank finished
    later): the x range stops at that span, not at the iteration's end."""
    limits: list[tuple[Any, ...]] = []
    real = plots.plt.Axes.set_xlim

    def spy(ax: Any, *a: Any, **k: Any) -> Any:
        limits.append(a)
        return real(ax, *a, **k)

    monkeypatch.setattr(plots.plt.Axes, "set_xlim", spy)
    calls = [{"rank": 0, "iteration": 1, "axis": "dp", "t_intent_s": 1.0, "t_ack_s": 1.1,
              "t_end_s": 1.4}]
    compute = [{"rank": 0, "it": 1, "t_start": 1.4, "t_end": 1.5}]
    circuits = [{"rail": 0, "t_dark_s": 1.02, "t_light_s": 1.08}]
    iteration = {"iteration": 1, "t_start_s": 1.0, "t_end_s": 3.0}
    plots.timeline(calls, compute, circuits, iteration, [0], [0], tmp_path / "t.png", "t")
    assert (0, pytest.approx(0.5)) in limits  # the last span ends 0.5 s in, not 2 s
