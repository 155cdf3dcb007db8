"""A run as a timeline: Chrome trace-event JSON that Perfetto and ``chrome://tracing`` open (pure).

Records in, trace-event dicts out; :mod:`testbed.cli.export` reads the run directory and writes
the file. Times come from the run's own records (the ranks', the controller's, the OCS app's),
shifted so that the run starts at 0 and written in whole microseconds (``ts``, ``dur``); nothing
is re-modelled. Tracks (one Chrome "process" per group, one "thread" per track):

* **run** (pid 1): ``iterations`` (one span per iteration, warm-up ones apart: category
  ``warm-up``), ``failures`` (each recovery ``[fault, first collective with the spare]`` with its
  parts ``detection`` and ``restart``, and the ``rewiring`` dark periods inside the restart),
  ``faults`` (instants: injected faults, detections, spares assigned, resumptions).
* **OCS rail R** (pid 100 + R): ``switches`` (one span per switch of the rail, from the request
  to the light, with its parts ``removal`` (request to dark, where the run records it apart),
  ``configured delay`` and, where the run measured it (emulated runs), ``late light`` past the
  configured delay), and one track per OCS port with its dark periods (removal to light).
* **Opus controller** (pid 2): one track per comm group with the intents and acks of its
  members (zero-length slices, an arrow from each intent to its ack) and the decisions (an arrow
  through the switches they caused); ``events`` has the rest of the controller's log.
* **server S** (pid 10000 + S): rank ``R``'s tracks: ``rank R`` (compute spans, the rank's own
  events) and ``rank R <lane>`` per communication lane (each collective, from its ack to its end,
  named ``kind group`` with its bytes, algorithm and phase; before it, ``wait for ack`` from the
  intent to the ack). A rank's lanes run at once, so they are tracks of their own; spans that
  would overlap on one track go to a further ``#2`` track.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from testbed.metrics.darktime import ExpectedDelay, union_intervals
from workloads.config import chosen_algorithm
from workloads.layout import AXIS_FAMILY
from workloads.phases import KIND_FAMILY

Event = dict[str, Any]
Record = Mapping[str, Any]

PID_RUN = 1
PID_CONTROLLER = 2
PID_OCS = 100  # + rail
PID_SERVER = 10_000  # + server
#: Controller events shown on the group tracks (besides intents, acks and decisions).
GROUP_EVENTS = ("speculative_intent", "provisioned")
#: Controller events shown elsewhere or not at all: the ranks' spans show completions.
SKIPPED_EVENTS = ("intent", "ack", "decision", "reconfig_start", "reconfig_end", "complete",
                  "collective_done", *GROUP_EVENTS)
#: Failure events on the run's ``faults`` track.
FAILURE_EVENTS = ("fault", "failure_detected", "spare_assigned", "ranks_resumed",
                  "heartbeat_lost", "epoch_aborted")


@dataclass(frozen=True)
class RunFacts:
    """What the trace needs to know about a run besides its records.

    ``t0_s``: the run's clock at trace time 0. ``expected``: the configured delay the emulated
    OCS's dark periods are judged against (:mod:`testbed.metrics.darktime`); None where the run
    measured no error (simulated runs switch in the delay exactly). ``ranks``: only these
    ranks' tracks (and their ports, intents and acks); None for all.
    """

    name: str
    t0_s: float
    gpus_per_server: int = 1
    ports_per_rank: int = 1
    num_rails: int = 1
    world_size: int = 0
    switching_delay_ms: float | None = None
    expected: ExpectedDelay | None = None
    algorithms: tuple[tuple[str, str, str], ...] = ()
    ranks: frozenset[int] | None = None

    def shows(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def algorithm(self, kind: str, axis: str) -> str:
        """The configured algorithm of ``kind`` on ``axis``, as the schedule chose it (kinds
        without a choice of algorithm run a ring)."""
        return chosen_algorithm(self.algorithms, kind, axis) or "ring"


@dataclass(frozen=True)
class Switch:
    """One switch of a rail: its request, dark and light times, what it changed, and the
    controller's decisions it served (decisions applied together share one switch)."""

    rail: int
    t_request_s: float
    t_dark_s: float
    t_light_s: float
    added: tuple[tuple[int, int], ...]
    removed: tuple[tuple[int, int], ...]
    decisions: tuple[int, ...] = ()
    recorded_delay_ms: float | None = None

    @property
    def ports(self) -> list[int]:
        return sorted({p for c in (*self.added, *self.removed) for p in c})

    @property
    def dark_ms(self) -> float:
        return (self.t_light_s - self.t_dark_s) * 1e3


def _pair(c: Any) -> tuple[int, int]:
    if isinstance(c, Mapping):
        return int(c["port_a"]), int(c["port_b"])
    a, b = c
    return int(a), int(b)


def switches(controller_events: Iterable[Record], ocs_events: Iterable[Record] = ()
             ) -> list[Switch]:
    """The run's switches, from the controller's ``reconfig_end`` records that have a dark
    period; records of one rail with the same dark time are one switch (decisions applied
    together, :mod:`controller.batching`). ``ocs_events`` (the emulated OCS app's log) add
    the delay the app recorded."""
    recorded = {(int(e["rail"]), float(e["t_s"])): float(e["delay_ms"]) for e in ocs_events
                if e.get("event") == "dark" and e.get("delay_ms") is not None}
    found: dict[tuple[int, float], Switch] = {}
    for e in controller_events:
        if e.get("event") != "reconfig_end" or e.get("t_dark_s") is None \
                or e.get("t_light_s") is None:
            continue
        rail, t_dark, t_light = int(e["rail"]), float(e["t_dark_s"]), float(e["t_light_s"])
        key = (rail, t_dark)  # as testbed.metrics.darktime.controller_switches counts
        decision = (int(e["decision"]),) if e.get("decision") is not None else ()
        old = found.get(key)
        if old is not None:
            found[key] = Switch(rail, min(old.t_request_s, float(e.get("t_request_s", t_dark))),
                                t_dark, max(old.t_light_s, t_light),
                                tuple(sorted({*old.added, *map(_pair, e.get("added", []))})),
                                tuple(sorted({*old.removed,
                                              *map(_pair, e.get("removed", []))})),
                                old.decisions + decision, old.recorded_delay_ms)
            continue
        found[key] = Switch(rail, float(e.get("t_request_s", t_dark)), t_dark, t_light,
                            tuple(map(_pair, e.get("added", []))),
                            tuple(map(_pair, e.get("removed", []))), decision,
                            recorded.get((rail, t_dark)))
    return sorted(found.values(), key=lambda s: (s.t_dark_s, s.rail))


@dataclass
class Trace:
    """Ids of the trace's tracks and arrows, and the metadata events that name the tracks."""

    facts: RunFacts
    _tracks: dict[tuple[int, Any], int] = field(default_factory=dict)
    _processes: set[int] = field(default_factory=set)
    _flows: int = 0

    def us(self, t_s: float) -> int:
        """Trace time (whole microseconds since ``t0_s``) of the run's clock ``t_s``."""
        return round((float(t_s) - self.facts.t0_s) * 1e6)

    def flow(self) -> int:
        self._flows += 1
        return self._flows

    def track(self, pid: int, process: str, key: Any, name: str, sort: int,
              out: list[Event]) -> tuple[int, int]:
        """(pid, tid) of track ``key`` of process ``pid``; the first time, append the metadata
        events naming it (and its process) to ``out``. Thread ids are unique in the trace."""
        if pid not in self._processes:
            self._processes.add(pid)
            out += [_meta("process_name", pid, 0, name=process),
                    _meta("process_sort_index", pid, 0, sort_index=pid)]
        tid = self._tracks.get((pid, key))
        if tid is None:
            tid = self._tracks[(pid, key)] = len(self._tracks) + 1
            out += [_meta("thread_name", pid, tid, name=name),
                    _meta("thread_sort_index", pid, tid, sort_index=sort)]
        return pid, tid

    def span(self, where: tuple[int, int], name: str, cat: str, t_a: float, t_b: float,
             args: Mapping[str, Any] | None = None, **extra: Any) -> Event:
        """An ``X`` event from ``t_a`` to ``t_b`` (run clock, s); ``dur`` >= 0."""
        a = self.us(t_a)
        b = max(a, self.us(t_b))
        ev: Event = {"name": name, "cat": cat, "ph": "X", "ts": a, "dur": b - a,
                     "pid": where[0], "tid": where[1]}
        if args:
            ev["args"] = dict(args)
        ev.update(extra)
        return ev

    def instant(self, where: tuple[int, int], name: str, cat: str, t_s: float,
                args: Mapping[str, Any] | None = None) -> Event:
        ev: Event = {"name": name, "cat": cat, "ph": "i", "s": "t", "ts": self.us(t_s),
                     "pid": where[0], "tid": where[1]}
        if args:
            ev["args"] = dict(args)
        return ev


def _meta(kind: str, pid: int, tid: int, **args: Any) -> Event:
    return {"name": kind, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def _num(v: Any) -> float | None:
    return None if v in (None, "") else float(v)


# --------------------------------------------------------------------------- ranks

def _server(trace: Trace, rank: int) -> tuple[int, str]:
    server = rank // max(1, trace.facts.gpus_per_server)
    return PID_SERVER + server, f"server {server}"


def rank_events(trace: Trace, rank: int, records: Iterable[Record]) -> Iterator[Event]:
    """Rank ``rank``'s compute spans, collectives (``wait for ack`` apart from the transfer) and
    own events (started, fault, resumed, finished, error)."""
    if not trace.facts.shows(rank):
        return
    spans: list[tuple[str, float, float, str, str, dict[str, Any]]] = []  # lane, a, b, ...
    points: list[tuple[float, str, dict[str, Any]]] = []
    for r in records:
        ev = r.get("ev")
        if ev == "compute":
            spans.append(("", float(r["t_start"]), float(r["t_end"]), "compute", "compute",
                          _keep(r, ("it", "i", "epoch"))))
        elif ev == "call":
            spans += _call_spans(trace.facts, r)
        elif ev not in ("iteration",) and _num(r.get("t")) is not None:
            points.append((float(r["t"]), str(ev), _keep(r, ("it", "epoch", "kind", "index",
                                                             "message", "profile_mismatches"))))
    out: list[Event] = []
    pid, process = _server(trace, rank)
    lanes = sorted({s[0] for s in spans} - {""})
    rows: dict[str, list[float]] = defaultdict(list)  # lane -> end of each of its tracks
    tracks: dict[tuple[str, int], tuple[int, int]] = {}
    for lane, a, b, name, cat, args in sorted(spans, key=lambda s: (s[1], s[2])):
        ends = rows[lane]
        row = next((k for k, end in enumerate(ends) if end <= a), len(ends))
        if row == len(ends):
            ends.append(b)
        ends[row] = max(b, ends[row])
        where = tracks.get((lane, row))
        if where is None:
            label = (f"rank {rank}" + (f" {lane}" if lane else "")
                     + (f" #{row + 1}" if row else ""))
            sort = rank * 1000 + (lanes.index(lane) + 1 if lane else 0) * 10 + row
            where = tracks[(lane, row)] = trace.track(pid, process, (rank, lane, row), label,
                                                      sort, out)
        out.append(trace.span(where, name, cat, a, b, args))
    where = trace.track(pid, process, (rank, "", 0), f"rank {rank}", rank * 1000, out)
    for t, name, args in points:
        out.append(trace.instant(where, name, "rank", t, args))
    yield from out


def _keep(r: Record, keys: Sequence[str]) -> dict[str, Any]:
    return {k: r[k] for k in keys if r.get(k) is not None}


def _call_spans(facts: RunFacts, r: Record
                ) -> list[tuple[str, float, float, str, str, dict[str, Any]]]:
    """The wait (intent to ack) and the transfer (ack to end) of one call record."""
    t_intent, t_ack, t_end = _num(r.get("t_intent")), _num(r.get("t_ack")), _num(r.get("t_end"))
    start = t_ack if t_ack is not None else t_intent
    if start is None or t_end is None:
        return []
    kind, axis, lane = str(r.get("kind", "")), str(r.get("axis", "")), str(r.get("lane", ""))
    args: dict[str, Any] = {
        "kind": kind, "group": lane, "collective": r.get("cid", ""), "axis": axis,
        "phase": f"{AXIS_FAMILY.get(axis, axis)}/{KIND_FAMILY.get(kind, kind)}",
        "algorithm": r.get("algorithm") or facts.algorithm(kind, axis),
        "size_bytes": r.get("size_bytes"), "wire_bytes": r.get("wire_bytes"),
        **_keep(r, ("it", "i", "seq", "reconfigured", "epoch", "segments", "segment_wait_s",
                    "op", "retries"))}
    if r.get("expected") is not None and r.get("received") is not None:
        args["delivered"] = int(r["received"]) == int(r["expected"])
    out = []
    if t_intent is not None and t_ack is not None and t_ack > t_intent:
        out.append((lane, t_intent, t_ack, "wait for ack", "wait",
                    {"group": lane, "seq": r.get("seq"), "reconfigured": r.get("reconfigured"),
                     "wait_ms": round((t_ack - t_intent) * 1e3, 3)}))
    out.append((lane, start, t_end, f"{kind} {lane}", "call", args))
    return out


# --------------------------------------------------------------------------- iterations, failures

def iteration_events(trace: Trace, iterations: Iterable[Record]) -> Iterator[Event]:
    """One span per iteration (an ``iterations.csv`` row); warm-up ones in category
    ``warm-up`` and named so."""
    out: list[Event] = []
    where = None
    for row in iterations:
        where = where or trace.track(PID_RUN, f"run {trace.facts.name}", "iterations",
                                     "iterations", 0, out)
        measured = row.get("measured") in (True, "True", "true", 1, "1")
        it = int(row["iteration"])
        out.append(trace.span(where, f"iteration {it}" + ("" if measured else " (warm-up)"),
                              "iteration" if measured else "warm-up",
                              float(row["t_start_s"]), float(row["t_end_s"]),
                              {"iteration": it, "measured": measured,
                               "iteration_time_s": float(row["iteration_time_s"])}))
    yield from out


def failure_events(trace: Trace, failovers: Iterable[Record], events: Iterable[Record],
                   sws: Sequence[Switch]) -> Iterator[Event]:
    """Each recovery (a ``failovers.csv`` row) as a span with its parts, and the failure
    events of the controller's log as instants."""
    out: list[Event] = []
    process = f"run {trace.facts.name}"
    where = None
    for row in failovers:
        where = where or trace.track(PID_RUN, process, "failures", "failures", 1, out)
        t_fail, t_detect = float(row["t_fail_s"]), float(row["t_detect_s"])
        t_resume, t_first = float(row["t_resume_s"]), _num(row.get("t_first_s"))
        t_end = t_first if t_first is not None else t_resume
        args = {k: v for k, v in row.items() if v not in (None, "")}
        out.append(trace.span(where, f"recovery of rank {row['rank']} ({row['policy']})",
                              "failure", t_fail, t_end, args))
        out.append(trace.span(where, "detection", "failure", t_fail, t_detect,
                              {"detection_s": _num(row.get("detection_s"))}))
        out.append(trace.span(where, "restart", "failure", t_detect, t_end,
                              {"restart_s": _num(row.get("restart_s")),
                               "rewiring_s": _num(row.get("rewiring_s")),
                               "note": "restart_s excludes the rewiring spans inside it"}))
        rail = row.get("rail")
        ports = {int(p) for p in str(row.get("new_ports") or "").split()}
        if rail in (None, "") or not ports:
            continue
        dark = [(max(s.t_dark_s, t_detect), min(s.t_light_s, t_end)) for s in sws
                if s.rail == int(rail) and ports & set(s.ports) and s.t_light_s >= t_resume
                and s.t_dark_s <= t_end]
        for a, b in union_intervals(dark):
            out.append(trace.span(where, "rewiring", "failure", a, b,
                                  {"rail": int(rail), "ports": sorted(ports)}))
    marks = None
    for e in events:
        if e.get("event") in FAILURE_EVENTS:
            marks = marks or trace.track(PID_RUN, process, "faults", "faults", 2, out)
            out.append(trace.instant(marks, str(e["event"]), "failure", float(e["t_s"]),
                                     {k: v for k, v in e.items() if k not in ("event", "t_s")}))
    yield from out


# --------------------------------------------------------------------------- the OCS

def _port_owners(facts: RunFacts) -> dict[tuple[int, int], int]:
    """(rail, port) -> the rank owning it at the start (:func:`controller.job.rank_rail_ports`)."""
    from controller.job import rank_rail_ports

    out = {}
    for r in range(facts.world_size):
        rp = rank_rail_ports(r, facts.gpus_per_server, facts.ports_per_rank, facts.num_rails)
        for p in rp.ports:
            out[(rp.rail, p)] = r
    return out


def ocs_events(trace: Trace, sws: Sequence[Switch], decision_flows: Mapping[int, int]
               ) -> Iterator[Event]:
    """Per rail: the switches with their parts, and the dark periods of each port.
    ``decision_flows``: decision -> arrow id begun at the decision (the arrow runs on through
    the decision's switches)."""
    facts = trace.facts
    owners = _port_owners(facts)
    expected = facts.expected
    out: list[Event] = []
    chained: dict[int, list[int]] = defaultdict(list)  # decision -> the switches it leads
    for k, s in enumerate(sws):
        if s.decisions:
            chained[s.decisions[0]].append(k)
    for k, s in enumerate(sws):
        pid, process = PID_OCS + s.rail, f"OCS rail {s.rail}"
        where = trace.track(pid, process, "switches", "switches", -1, out)
        delay_ms = (expected.base(s.rail) if expected is not None
                    else facts.switching_delay_ms)
        args: dict[str, Any] = {
            "switch": k, "decisions": list(s.decisions), "ports": s.ports,
            "added": " ".join(f"{a}-{b}" for a, b in s.added),
            "removed": " ".join(f"{a}-{b}" for a, b in s.removed),
            "dark_ms": round(s.dark_ms, 4), "configured_delay_ms": delay_ms}
        late = None
        if expected is not None:
            low, high = expected.range_ms(s.rail)
            error = s.dark_ms - high if s.dark_ms > high else min(0.0, s.dark_ms - low)
            args["error_ms"] = round(error, 4)
            if s.recorded_delay_ms is not None:
                args["app_delay_ms"] = s.recorded_delay_ms
            if error > 0:
                late = s.t_dark_s + high / 1e3
        flow: dict[str, Any] = {}
        for d in s.decisions[:1]:
            fid = decision_flows.get(d)
            if fid is None:
                continue
            steps = chained[d]
            flow = {"bind_id": fid, "flow_in": True}
            if steps.index(k) + 1 < len(steps):
                flow["flow_out"] = True
        out.append(trace.span(where, _switch_name(s), "switch", s.t_request_s, s.t_light_s,
                              args, **flow))
        if s.t_dark_s > s.t_request_s:
            out.append(trace.span(where, "removal", "removal", s.t_request_s, s.t_dark_s))
        if delay_ms is not None:
            out.append(trace.span(where, f"configured delay {delay_ms:g} ms", "delay",
                                  s.t_dark_s, min(s.t_light_s, s.t_dark_s + delay_ms / 1e3)))
        if late is not None:
            out.append(trace.span(where, f"late light +{args['error_ms']:g} ms", "late-light",
                                  late, s.t_light_s))
        peers_old = {p: q for a, b in s.removed for p, q in ((a, b), (b, a))}
        peers_new = {p: q for a, b in s.added for p, q in ((a, b), (b, a))}
        for p in s.ports:
            owner = owners.get((s.rail, p))
            if facts.ranks is not None and (owner is None or owner not in facts.ranks):
                continue
            label = f"port {p}" + (f" (rank {owner})" if owner is not None else "")
            port = trace.track(pid, process, ("port", p), label, p, out)
            old, new = peers_old.get(p), peers_new.get(p)
            out.append(trace.span(port, f"dark: peer {'none' if old is None else old} -> "
                                  f"{'none' if new is None else new}", "dark", s.t_dark_s,
                                  s.t_light_s, {"switch": k, "from_peer": old, "to_peer": new}))
    yield from out


def _switch_name(s: Switch) -> str:
    """``switch -1-2 +1-3`` for a switch of one or two circuits, else ``switch -4 +4 circuits``
    (names are shared across a trace: a large rail's would all differ)."""
    if len(s.added) + len(s.removed) <= 2:
        return " ".join(["switch", *(f"-{a}-{b}" for a, b in s.removed),
                         *(f"+{a}-{b}" for a, b in s.added)])
    return f"switch -{len(s.removed)} +{len(s.added)} circuits"


# --------------------------------------------------------------------------- the controller

def controller_events(trace: Trace, events: Sequence[Record], sws: Sequence[Switch],
                      decision_flows: dict[int, int]) -> Iterator[Event]:
    """Intents and acks per comm group with an arrow from each intent to its ack, decisions
    (their arrows begin here: ``decision_flows`` is filled with their ids), and the rest of
    the controller's log on ``events``."""
    facts = trace.facts
    out: list[Event] = []
    acked = {(e.get("job"), e["group"], e["seq"], e["rank"]) for e in events
             if e.get("event") == "ack"}
    flows: dict[tuple[Any, ...], int] = {}
    switched = {s.decisions[0] for s in sws if s.decisions}  # arrows: one decision a switch
    other = None
    for e in events:
        kind = e.get("event")
        if kind in ("intent", "ack", "decision", *GROUP_EVENTS) and e.get("group") is not None:
            if "rank" in e and not facts.shows(int(e["rank"])):
                continue
            group = str(e["group"])
            where = trace.track(PID_CONTROLLER, "Opus controller", group, f"group {group}",
                                0, out)
            args = {k: v for k, v in e.items() if k not in ("event", "t_s", "group")}
            extra: dict[str, Any] = {}
            key = (e.get("job"), e["group"], e.get("seq"), e.get("rank"))
            name = f"{kind} r{e['rank']}" if "rank" in e else str(kind)
            if kind == "intent" and key in acked and key not in flows:
                flows[key] = trace.flow()
                extra = {"bind_id": flows[key], "flow_out": True}
            elif kind == "ack" and key in flows:
                extra = {"bind_id": flows.pop(key), "flow_in": True}
            elif kind == "decision":
                name = f"decision {e['decision']}"
                if int(e["decision"]) in switched:
                    decision_flows[int(e["decision"])] = trace.flow()
                    extra = {"bind_id": decision_flows[int(e["decision"])], "flow_out": True}
            out.append(trace.span(where, name, str(kind), float(e["t_s"]), float(e["t_s"]),
                                  args, **extra))
        elif kind == "mispredict":
            where = trace.track(PID_CONTROLLER, "Opus controller", str(e["actual_group"]),
                                f"group {e['actual_group']}", 0, out)
            out.append(trace.instant(where, "mispredict", "mispredict", float(e["t_s"]),
                                     {k: v for k, v in e.items() if k not in ("event", "t_s")}))
        elif kind not in SKIPPED_EVENTS and kind not in FAILURE_EVENTS and "t_s" in e:
            other = other or trace.track(PID_CONTROLLER, "Opus controller", "", "events", -1,
                                         out)
            out.append(trace.instant(other, str(kind), "controller", float(e["t_s"]),
                                     {k: v for k, v in e.items() if k not in ("event", "t_s")}))
    yield from out


# --------------------------------------------------------------------------- the whole trace

def trace_events(facts: RunFacts, ranks: Iterable[tuple[int, Iterable[Record]]],
                 events: Sequence[Record], *, ocs: Sequence[Record] = (),
                 iterations: Iterable[Record] = (), failovers: Iterable[Record] = ()
                 ) -> Iterator[Event]:
    """Every event of a run's trace. ``ranks`` is consumed lazily, one rank at a time (the
    records of a large run need not all be in memory)."""
    trace = Trace(facts)
    sws = switches(events, ocs)
    decision_flows: dict[int, int] = {}
    yield from iteration_events(trace, iterations)
    yield from failure_events(trace, failovers, events, sws)
    yield from controller_events(trace, events, sws, decision_flows)
    yield from ocs_events(trace, sws, decision_flows)
    for rank, records in ranks:
        yield from rank_events(trace, rank, records)


#: Events encoded at once (one C call of the JSON encoder, one line of the file).
WRITE_CHUNK = 2000


def write_trace(events: Iterable[Event], fh: TextIO, other: Mapping[str, Any]) -> int:
    """Write ``events`` as a Chrome trace-event JSON object as they come (at most
    :data:`WRITE_CHUNK` of them held); returns how many were written. ``other``: the file's
    ``otherData``."""
    fh.write('{"displayTimeUnit": "ms", "otherData": ' + json.dumps(other, default=str)
             + ',\n"traceEvents": [\n')
    n = 0
    dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode
    chunk: list[Event] = []
    for ev in events:
        chunk.append(ev)
        if len(chunk) == WRITE_CHUNK:
            fh.write(("," if n else "") + dumps(chunk)[1:-1] + "\n")
            n += len(chunk)
            chunk.clear()
    if chunk:
        fh.write(("," if n else "") + dumps(chunk)[1:-1] + "\n")
        n += len(chunk)
    fh.write("]}\n")
    return n


# --------------------------------------------------------------------------- checks

def check_trace(events: Iterable[Event]) -> list[str]:
    """What would make a viewer refuse or misdraw ``events`` (empty: none): every event has
    ``ph``, ``ts``, ``pid`` and ``tid``; ``X`` events a ``dur`` >= 0 and, on one track, nest
    (a span starting inside another ends inside it); ``B``/``E`` pairs balance per track;
    every arrow has one start and one end."""
    problems: list[str] = []
    spans: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    open_b: dict[tuple[Any, Any], int] = defaultdict(int)
    starts: dict[Any, int] = defaultdict(int)
    ends: dict[Any, int] = defaultdict(int)
    for i, ev in enumerate(events):
        missing = [k for k in ("ph", "ts", "pid", "tid") if k not in ev]
        if missing:
            problems.append(f"event {i} ({ev.get('name')}) lacks {', '.join(missing)}")
            continue
        track = (ev["pid"], ev["tid"])
        ph = ev["ph"]
        if ph == "X":
            dur = ev.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0 or math.isnan(dur):
                problems.append(f"event {i} ({ev.get('name')}): X with dur {dur!r}")
                continue
            spans[track].append((ev["ts"], ev["ts"] + dur, str(ev.get("name"))))
        elif ph == "B":
            open_b[track] += 1
        elif ph == "E":
            open_b[track] -= 1
            if open_b[track] < 0:
                problems.append(f"event {i}: E without B on track {track}")
                open_b[track] = 0
        if "bind_id" in ev:
            if ev.get("flow_out") and not ev.get("flow_in"):
                starts[ev["bind_id"]] += 1
            if ev.get("flow_in") and not ev.get("flow_out"):
                ends[ev["bind_id"]] += 1
    problems += [f"track {t}: {n} B without E" for t, n in open_b.items() if n]
    for flow in set(starts) | set(ends):
        if starts[flow] != 1 or ends[flow] != 1:
            problems.append(f"arrow {flow}: {starts[flow]} start(s), {ends[flow]} end(s)")
    for track, xs in spans.items():
        stack: list[tuple[float, float, str]] = []
        for a, b, name in sorted(xs, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1][1] <= a:
                stack.pop()
            if stack and b > stack[-1][1]:
                problems.append(f"track {track}: {name!r} [{a}, {b}] overlaps "
                                f"{stack[-1][2]!r} [{stack[-1][0]}, {stack[-1][1]}]")
                continue
            stack.append((a, b, name))
    return problems
