"""Golden traces of the Opus core: its inputs recorded from real runs, replayed into a new core.

A trace is what a run fed :class:`~controller.core.OpusCore` — its rails and configuration, then
every ``register_job``, ``unregister_job``, ``intent``, ``complete``, ``reconfig_done``,
``reconfig_failed``, ``rank_lost`` and ``rank_rejoined`` with their arguments and times — as
gzipped JSON lines. :func:`replay` feeds it to a fresh core and
returns a digest of everything the core answered (acks, rejects, decisions, events). The digest
of the core as it was when the trace was recorded is stored beside the trace, so a change that
alters one decision, ack or event fails the golden test, whatever the engine around the core
does now (the inputs are fixed).

Record again (only when a change of the core's behaviour is intended, and say so in the commit):
``.venv/bin/python tests/controller/core_trace.py [NAME ...]`` from the repository root (names:
only those scenarios; the others keep their traces and digests).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from controller.core import CoreConfig, Intent, OpusCore, Output
from controller.job import JobSpec
from controller.ocs import ApplyResult, Circuit, RailDescription

DATA = Path(__file__).resolve().parent / "data"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: (name, experiment file, overrides): the recorded scenarios.
SCENARIOS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("tiny-on-demand", "tiny.yaml", {"mode": "on-demand"}),
    ("tiny-provisioning", "tiny.yaml", {"mode": "provisioning"}),
    ("tiny-degree-aware", "tiny.yaml", {"mode": "degree-aware"}),
    ("llama3-8b-provisioning", "llama3-8b.yaml",
     {"mode": "provisioning", "warmup": 1, "iterations": 1}),
    ("llama3-8b-on-demand-jitter", "llama3-8b.yaml",
     {"mode": "on-demand", "warmup": 1, "iterations": 1, "seed": 7}),
    ("bench-core-1024", "bench-core", {"iterations": 1}),
    # random worlds (core_random.py): deep queues, lost ranks, failed switches, bad input
    ("random-on-demand-k1", "random", {"seed": 1, "mode": "on-demand"}),
    ("random-on-demand-k2", "random", {"seed": 2, "mode": "on-demand", "ports_per_rank": 2}),
    ("random-provisioning-k1", "random", {"seed": 3, "mode": "provisioning"}),
    ("random-provisioning-k2", "random", {"seed": 4, "mode": "provisioning",
                                          "ports_per_rank": 2}),
    ("random-degree-aware-k2", "random", {"seed": 5, "mode": "degree-aware",
                                          "ports_per_rank": 2}),
    ("random-degree-aware-k1", "random", {"seed": 6, "mode": "degree-aware"}),
    ("random-deep-queue", "random", {"seed": 7, "mode": "provisioning", "ranks": [48, 8],
                                     "groups": [60, 6], "steps": 4000, "ask_weight": 0.5}),
    ("random-deep-queue-on-demand", "random", {"seed": 8, "mode": "on-demand",
                                               "ranks": [48, 8], "groups": [60, 6],
                                               "ports_per_rank": 2, "steps": 4000,
                                               "ask_weight": 0.5}),
)


def _intent_json(i: Intent | None) -> dict[str, Any] | None:
    return None if i is None else asdict(i)


def _intent(d: dict[str, Any] | None) -> Intent | None:
    return None if d is None else Intent(**d)


def _result(d: dict[str, Any]) -> ApplyResult:
    rail = int(d["rail"])
    return ApplyResult(rail, frozenset(Circuit(rail, a, b) for a, b in d["added"]),
                       frozenset(Circuit(rail, a, b) for a, b in d["removed"]),
                       d["t_request_s"], d["t_dark_s"], d["t_light_s"])


class RecordingCore(OpusCore):
    """An :class:`OpusCore` that writes down every input it gets."""

    log: list[list[Any]]

    def __init__(self, rails: Any, config: CoreConfig | None = None, circuits: Any = ()) -> None:
        self.log = [["init", [r.to_json() for r in rails], asdict(config or CoreConfig()),
                     [[c.rail, c.port_a, c.port_b] for c in circuits]]]
        super().__init__(rails, config, circuits)

    def register_job(self, job: JobSpec, now: float, ref: object = None) -> Output:
        self.log.append(["register_job", job.to_json(), now])
        return super().register_job(job, now, ref)

    def intent(self, intent: Intent, now: float, ref: object = None) -> Output:
        self.log.append(["intent", _intent_json(intent), now])
        return super().intent(intent, now, ref)

    def complete(self, job_id: str, rank: int, group_id: str, seq: int, now: float,
                 ref: object = None, next_intent: Intent | None = None) -> Output:
        self.log.append(["complete", job_id, rank, group_id, seq, now,
                         _intent_json(next_intent)])
        return super().complete(job_id, rank, group_id, seq, now, ref, next_intent)

    def reconfig_done(self, decision_id: int, results: Any, now: float) -> Output:
        self.log.append(["reconfig_done", decision_id, [r.to_json() for r in results], now])
        return super().reconfig_done(decision_id, results, now)

    def reconfig_failed(self, decision_id: int, error: str, now: float) -> Output:
        self.log.append(["reconfig_failed", decision_id, error, now])
        return super().reconfig_failed(decision_id, error, now)

    def unregister_job(self, job_id: str, now: float) -> Output:
        self.log.append(["unregister_job", job_id, now])
        return super().unregister_job(job_id, now)

    def rank_lost(self, job_id: str, rank: int, now: float) -> Output:
        self.log.append(["rank_lost", job_id, rank, now])
        return super().rank_lost(job_id, rank, now)

    def rank_rejoined(self, job_id: str, rank: int, now: float) -> Output:
        self.log.append(["rank_rejoined", job_id, rank, now])
        return super().rank_rejoined(job_id, rank, now)


class _Digest:
    """SHA-256 of a core's answers, in the order it gave them."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.counts = {"acks": 0, "rejects": 0, "decisions": 0, "events": 0}

    def add(self, out: Output) -> None:
        rows: list[Any] = []
        for a in out.acks:
            rows.append(["ack", a.job_id, a.rank, a.group_id, a.seq, a.reconfigured])
        for r in out.rejects:
            rows.append(["reject", r.code, r.message])
        for d in out.decisions:
            rows.append(["decision", d.decision_id, d.job_id, d.group_id, d.seq, d.speculative,
                         [rc.to_json() for rc in d.reconfs]])
        for e in out.events:
            rows.append(["event", {k: round(v, 9) if isinstance(v, float) else v
                                   for k, v in sorted(e.items())}])
        self.counts["acks"] += len(out.acks)
        self.counts["rejects"] += len(out.rejects)
        self.counts["decisions"] += len(out.decisions)
        self.counts["events"] += len(out.events)
        for row in rows:
            self.sha.update(json.dumps(row, separators=(",", ":"), sort_keys=True).encode())
            self.sha.update(b"\n")


def replay(lines: list[list[Any]]) -> dict[str, Any]:
    """Feed a recorded trace to a fresh core; the digest and counts of its answers."""
    head = lines[0]
    assert head[0] == "init", f"a trace starts with init, not {head[0]}"
    rails = [RailDescription.from_json(r) for r in head[1]]
    core = OpusCore(rails, CoreConfig(**head[2]),
                    circuits=[Circuit(r, a, b) for r, a, b in head[3]])
    digest = _Digest()
    for line in lines[1:]:
        kind = line[0]
        if kind == "register_job":
            out = core.register_job(JobSpec.from_json(line[1]), line[2])
        elif kind == "intent":
            intent = _intent(line[1])
            assert intent is not None
            out = core.intent(intent, line[2])
        elif kind == "complete":
            out = core.complete(line[1], line[2], line[3], line[4], line[5],
                                next_intent=_intent(line[6]))
        elif kind == "reconfig_done":
            out = core.reconfig_done(line[1], [_result(r) for r in line[2]], line[3])
        elif kind == "reconfig_failed":
            out = core.reconfig_failed(line[1], line[2], line[3])
        elif kind == "unregister_job":
            out = core.unregister_job(line[1], line[2])
        elif kind == "rank_lost":
            out = core.rank_lost(line[1], line[2], line[3])
        elif kind == "rank_rejoined":
            out = core.rank_rejoined(line[1], line[2], line[3])
        else:
            raise ValueError(f"unknown trace line {kind!r}")
        digest.add(out)
    return {"sha256": digest.sha.hexdigest(), **digest.counts, "inputs": len(lines) - 1}


def trace_path(name: str) -> Path:
    return DATA / f"core-trace-{name}.jsonl.gz"


def load_trace(name: str) -> list[list[Any]]:
    with gzip.open(trace_path(name), "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def expected() -> dict[str, dict[str, Any]]:
    """The digests recorded with the traces."""
    return dict(json.loads((DATA / "core-trace-digests.json").read_text()))


@contextmanager
def _recording(module: Any) -> Iterator[list[RecordingCore]]:
    """Cores that ``module`` builds (it names ``OpusCore``) record their inputs meanwhile."""
    cores: list[RecordingCore] = []

    def make(*args: Any, **kwargs: Any) -> RecordingCore:
        core = RecordingCore(*args, **kwargs)
        cores.append(core)
        return core

    original = module.OpusCore
    module.OpusCore = make
    try:
        yield cores
    finally:
        module.OpusCore = original


def record(name: str, config: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Run one scenario, store its trace; returns its digest.

    ``config`` is an experiment file run on the sim backend, ``bench-core``: the 1024-rank
    job of ``opus-testbed bench intents`` (DP rings and PP pairs), or ``random``: a random world
    of :mod:`core_random` (``overrides``: seed, mode and :class:`core_random.WorldShape` fields).
    """
    if config == "random":
        from core_random import WorldShape, drive

        params = dict(overrides)
        seed, mode = params.pop("seed"), params.pop("mode")
        shape = WorldShape(**{k: tuple(v) if isinstance(v, list) else v
                              for k, v in params.items()})
        cores = [drive(RecordingCore, seed, mode, shape)]
    elif config == "bench-core":
        from controller import bench

        with _recording(bench) as cores:
            bench.bench_core(**overrides)
    else:
        from testbed.experiment.config import load_experiment
        from testbed.experiment.prepare import prepare
        from testbed.simulator import engine
        from testbed.simulator.run import simulate_plan

        cfg = load_experiment(EXAMPLES / config).replace(**overrides)
        with _recording(engine) as cores:
            simulate_plan(prepare(cfg, check_capacity=False))
    (core,) = cores
    DATA.mkdir(exist_ok=True)
    with gzip.GzipFile(trace_path(name), "wb", mtime=0) as fh:
        for line in core.log:
            fh.write((json.dumps(line, separators=(",", ":")) + "\n").encode())
    return replay(load_trace(name))


def main(names: list[str]) -> int:
    """Record the scenarios ``names`` (all when empty); the others keep their digests."""
    unknown = set(names) - {s[0] for s in SCENARIOS}
    if unknown:
        print(f"unknown scenario(s) {sorted(unknown)}; known: {[s[0] for s in SCENARIOS]}",
              file=sys.stderr)
        return 2
    path = DATA / "core-trace-digests.json"
    old = json.loads(path.read_text()) if names and path.exists() else {}
    fresh = {name: record(name, config, overrides) for name, config, overrides in SCENARIOS
             if not names or name in names}
    digests = {name: fresh.get(name, old.get(name)) for name, _, _ in SCENARIOS
               if name in fresh or name in old}
    path.write_text(json.dumps(digests, indent=1) + "\n")
    for name, d in fresh.items():
        print(f"{name}: {d['inputs']} inputs, {d['decisions']} decisions, {d['acks']} acks",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
