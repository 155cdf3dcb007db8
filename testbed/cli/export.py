"""``opus-testbed export perfetto RUN_DIR``: a run directory as a Perfetto / Chrome trace.

The shell around :mod:`testbed.results.perfetto`: reads the run's records (``ranks/rank*.jsonl``
one rank at a time, ``controller-events.jsonl``, ``emulator/ocs-events.jsonl``,
``iterations.csv``, ``failovers.csv``, ``summary.json``, ``manifest.json``, ``experiment.yaml``)
and streams the trace to a file. ``run --perfetto`` and ``sweep --perfetto`` call
:func:`export_tree` on their results directory.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from textwrap import fill
from typing import Any

from testbed.experiment.dilation import to_model_time
from testbed.results.store import parse_jsonl_lines, read_jsonl

TRACE_FILE = "trace.json"


def parse_ranks(text: str) -> frozenset[int]:
    """``0-15,128,130-131`` as a set of ranks (argparse turns a ValueError into exit 2)."""
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        a, sep, b = part.partition("-")
        lo, hi = int(a), int(b) if sep else int(a)
        if hi < lo or lo < 0:
            raise ValueError(f"bad rank range {part!r}")
        out.update(range(lo, hi + 1))
    if not out:
        raise ValueError("no ranks given")
    return frozenset(out)


def _rank_files(run_dir: Path) -> list[tuple[int, Path]]:
    files = []
    for path in (run_dir / "ranks").glob("rank*.jsonl"):
        m = re.fullmatch(r"rank(\d+)\.jsonl", path.name)
        if m:
            files.append((int(m.group(1)), path))
    return sorted(files)


def _first_time(path: Path) -> float | None:
    """The time of a rank file's first record (its start), read without reading the file."""
    with path.open(encoding="utf-8") as fh:
        line = fh.readline()
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    for key in ("t", "t_start", "t_intent", "t_issue"):
        if isinstance(rec.get(key), (int, float)):
            return float(rec[key])
    return None


def _experiment(run_dir: Path) -> dict[str, Any]:
    """The run's experiment file, parsed as plain YAML (only cluster and algorithms are read)."""
    import yaml

    path = run_dir / "experiment.yaml"
    try:
        doc = yaml.safe_load(path.read_text()) if path.exists() else None
    except yaml.YAMLError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _algorithms(doc: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """``workload.algorithms`` as (kind, axis or "", algorithm), as :mod:`workloads.loader`."""
    wl = doc.get("workload")
    chosen = wl.get("algorithms") if isinstance(wl, dict) else None
    out = []
    for kind, choice in (chosen or {}).items() if isinstance(chosen, dict) else ():
        if isinstance(choice, dict):
            out += [(str(kind), str(axis), str(name)) for axis, name in choice.items()]
        else:
            out.append((str(kind), "", str(choice)))
    return tuple(out)


def run_facts(run_dir: Path, events: list[dict[str, Any]], iterations: list[dict[str, str]],
              ranks: frozenset[int] | None) -> Any:
    """:class:`~testbed.results.perfetto.RunFacts` of a run directory."""
    from testbed.metrics.darktime import ExpectedDelay
    from testbed.results.perfetto import RunFacts

    summary = _json(run_dir / "summary.json")
    manifest = _json(run_dir / "manifest.json")
    doc = _experiment(run_dir)
    cluster = doc.get("cluster")
    cluster = cluster if isinstance(cluster, dict) else {}
    rails = int(manifest.get("rails") or 1)
    dark = summary.get("dark_error_ms") or {}
    exp = dark.get("expected") if isinstance(dark, dict) else None
    expected = (ExpectedDelay(float(exp["base_ms"]),
                              {int(r): float(v) for r, v in exp.get("per_rail_ms", {}).items()},
                              float(exp.get("jitter_ms", 0.0))) if exp else None)
    times = [float(e["t_s"]) for e in events if "t_s" in e]
    times += [float(r["t_start_s"]) for r in iterations if r.get("t_start_s")]
    for rank, path in _rank_files(run_dir):
        if ranks is None or rank in ranks:
            t = _first_time(path)
            if t is not None:
                times.append(t / float(manifest.get("time_dilation") or 1.0))
    delay = summary.get("switching_delay_ms")
    return RunFacts(
        name=str(summary.get("name") or run_dir.name), t0_s=min(times, default=0.0),
        gpus_per_server=int(cluster.get("gpus_per_server") or rails),
        ports_per_rank=int(summary.get("ports_per_rank") or 1), num_rails=rails,
        world_size=int(summary.get("world_size") or manifest.get("world_size") or 0),
        switching_delay_ms=None if delay is None else float(delay), expected=expected,
        algorithms=_algorithms(doc), ranks=ranks)


def read_events(path: Path) -> list[dict[str, Any]]:
    """The controller's log, less the events the trace does not show (``complete``,
    ``collective_done``: the ranks' spans show them), skipped before parsing: a large run's
    log is mostly these. Lines are otherwise read as :func:`testbed.results.store.read_jsonl`
    reads them (a cut-off last line is skipped, any other bad line is an error)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    return parse_jsonl_lines(path, [line if not any(s in line for s in _UNSHOWN) else ""
                                    for line in lines])


_UNSHOWN = tuple(f'"event":{sp}"{name}"' for name in ("complete", "collective_done")
                 for sp in ("", " "))


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def export_run(run_dir: Path, out: Path | None = None, ranks: frozenset[int] | None = None
               ) -> dict[str, Any]:
    """Write ``run_dir``'s trace to ``out`` (default ``RUN_DIR/trace.json``); returns what was
    written: file, events, bytes, seconds."""
    from testbed.results import store
    from testbed.results.perfetto import trace_events, write_trace

    t_start = time.monotonic()
    if not (run_dir / "controller-events.jsonl").exists() and not (run_dir / "ranks").is_dir():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no controller-events.jsonl "
                                "nor ranks/)")
    out = out or run_dir / TRACE_FILE
    # a dilated run's files keep the wall clock: the trace is in model time (wall / k)
    k = float(_json(run_dir / "manifest.json").get("time_dilation") or 1.0)
    events = to_model_time(read_events(run_dir / "controller-events.jsonl"), k)
    iterations = store.read_csv(run_dir / "iterations.csv")
    facts = run_facts(run_dir, events, iterations, ranks)

    def rank_records() -> Iterator[tuple[int, list[dict[str, Any]]]]:
        for rank, path in _rank_files(run_dir):
            if ranks is None or rank in ranks:
                yield rank, to_model_time(read_jsonl(path), k)

    stream = trace_events(facts, rank_records(), events,
                          ocs=to_model_time(read_jsonl(run_dir / "emulator" / "ocs-events.jsonl"),
                                            k),
                          iterations=iterations,
                          failovers=store.read_csv(run_dir / "failovers.csv"))
    other = {"run": str(run_dir.resolve()), "name": facts.name, "t0_s": facts.t0_s,
             "clock": "seconds of the run's model time (the wall clock / time_dilation "
                      "emulated, virtual simulated) minus t0_s, in microseconds",
             "time_dilation": k,
             "ranks": "all" if ranks is None else sorted(ranks)}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with tmp.open("w", encoding="utf-8") as fh:
        n = write_trace(stream, fh, other)
    tmp.replace(out)
    return {"file": str(out), "events": n, "size_bytes": out.stat().st_size,
            "seconds": round(time.monotonic() - t_start, 3)}


def run_dirs(path: Path) -> list[Path]:
    """``path`` if it is a run directory (``summary.json``), else the run directories below it
    (a sweep's points, ``run --baseline``'s two runs, a ladder's rungs)."""
    if (path / "summary.json").exists():
        return [path]
    return sorted(p.parent for p in path.rglob("summary.json"))


def export_tree(path: Path, say: Any = None) -> list[dict[str, Any]]:
    """``trace.json`` in every run directory of ``path`` (``run`` / ``sweep --perfetto``)."""
    written = []
    for run_dir in run_dirs(path):
        result = export_run(run_dir)
        if say is not None:
            say(f"trace: {result['file']} ({result['events']} events, "
                f"{result['size_bytes'] / 2**20:.1f} MiB, {result['seconds']:.1f} s)")
        written.append(result)
    return written


def cmd_export_perfetto(args: argparse.Namespace) -> int:
    """Export a run, or every run of ``run --baseline``'s folder or of a sweep (each to its own
    ``trace.json``); exit 2 naming the folders to give when RUN_DIR holds no run."""
    from testbed.results.folders import RUN, classify, not_a_results_folder

    run_dir = Path(args.run_dir)
    folder = classify(run_dir)
    if folder is None:
        print(f"error: {not_a_results_folder(run_dir)}", file=sys.stderr)
        return 2
    if folder.kind != RUN and args.out:
        print(f"error: {run_dir} holds {len(folder.runs)} runs ("
              + ", ".join(str(p) for p in folder.runs[:4])
              + (", ..." if len(folder.runs) > 4 else "")
              + "); --out names one trace file: give one run folder with --out, or none "
              "(each run's trace goes to its own trace.json)", file=sys.stderr)
        return 2
    try:
        results = [export_run(r, Path(args.out) if args.out else None, args.ranks)
                   for r in folder.runs]
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(results[0] if folder.kind == RUN else {"runs": results}, indent=1))
        return 0
    for result in results:
        print(f"wrote {result['file']}: {result['events']} events, "
              f"{result['size_bytes'] / 2**20:.1f} MiB in {result['seconds']:.1f} s")
    print("open each in https://ui.perfetto.dev (Open trace file) or chrome://tracing")
    return 0


def _ranks_arg(text: str) -> frozenset[int]:
    try:
        return parse_ranks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: Any) -> None:
    """Add ``export perfetto`` to the top-level parser."""
    p = sub.add_parser("export", help="export a run's records (export perfetto RUN_DIR)",
                       description="Export a run directory to other tools' formats.")
    fmt = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
    e = fmt.add_parser(
        "perfetto", help="Chrome trace-event JSON for ui.perfetto.dev or chrome://tracing",
        description=fill("Write the run's timeline as Chrome trace-event JSON: per server its "
        "ranks' compute, waits for acks and collectives; per OCS rail its switches and each "
        "port's dark periods; the controller's intents, acks (arrows from each intent to its "
        "ack) and decisions (arrows to their switches); iterations (warm-up apart) and "
        "failures. Times are the run's own records. RUN_DIR may also be run --baseline's "
        "folder (its baseline/ and MODE/ runs) or a sweep's: each of its runs gets its own "
        "trace.json. Exit 2 if RUN_DIR holds no run (the message names the run folders "
        "inside it)."),
        epilog="examples:\n"
        "  opus-testbed export perfetto results/my-sim   # run --baseline's folder: both runs\n"
        "  opus-testbed export perfetto results/my-sim/provisioning --ranks 0-1 --out t.json\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("run_dir", metavar="RUN_DIR",
                   help="a run directory (opus-testbed run --out), run --baseline's folder or "
                   "a sweep directory")
    e.add_argument("--out", metavar="FILE", help="trace file (default RUN_DIR/trace.json)")
    e.add_argument("--ranks", type=_ranks_arg, metavar="LIST",
                   help="only these ranks' tracks, ports, intents and acks, e.g. 0-15,128 "
                   "(the switches, decisions, iterations and failures are kept)")
    e.add_argument("--json", action="store_true", help="print what was written as JSON")
    e.set_defaults(func=cmd_export_perfetto)
