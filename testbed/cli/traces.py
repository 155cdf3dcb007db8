"""``opus-testbed import kineto|et`` and ``opus-testbed workload compare``: real runs as
schedules.

Glue only: the imports are :mod:`workloads.kineto` and :mod:`workloads.exec_trace`, the
comparison :mod:`workloads.compare`.
``workload compare`` shares its first word with ``workload CONFIG``; :func:`is_compare` tells
the command line which one it is given (a config file literally named ``compare`` is reached
as ``./compare``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workloads.trace_common import Imported

COMPARE_HELP = ("opus-testbed workload compare A B [--rank R] [--json]: two schedules side by "
                "side (schedule JSON or experiment files)")


def register(sub: Any) -> None:
    """Add ``import kineto`` and ``import et`` to the top-level parser."""
    p = sub.add_parser("import", help="turn real runs into workloads (import kineto|et TRACE...)",
                       description="Import traces of real training runs as schedules.")
    imp = p.add_subparsers(dest="source", required=True, metavar="SOURCE")
    k = imp.add_parser(
        "kineto", help="torch.profiler Chrome traces, one per rank",
        description="Read the Chrome traces torch.profiler writes (one per rank, .json or "
        ".json.gz), take one iteration and write DIR/workload.json (the schedule, "
        "workloads/FORMAT.md) and DIR/experiment.yaml (runnable: opus-testbed run "
        "DIR/experiment.yaml --backend sim). Layouts: record_param_comms with named args "
        "(+ NCCL kernels), nccl:* annotations, c10d::* ops with gloo:* annotations (torch 2.13 "
        "CPU), opus:* events. Exit 2 with the file, the event and why when a trace cannot be "
        "imported; nothing is written then.")
    _import_args(k)
    k.add_argument("--step", type=int, metavar="N", help="the ProfilerStep (or optimizer step) "
                   "to import (default: the last one every trace has)")
    k.set_defaults(func=cmd_import_kineto)
    e = imp.add_parser(
        "et", help="PyTorch execution traces (ExecutionTraceObserver JSON), one per rank",
        description="Read the execution traces torch.profiler.ExecutionTraceObserver writes "
        "(one per rank, named by rank: rank<R>.json[.gz]) and write DIR/workload.json and "
        "DIR/experiment.yaml as import kineto does. The traces hold no times: the schedule has "
        "the calls, their order and what blocks, no compute. Exit 2 with the file, the node "
        "and why when a trace cannot be imported; nothing is written then.")
    _import_args(e)
    e.set_defaults(func=cmd_import_et)


def _import_args(p: Any) -> None:
    """The arguments every ``import SOURCE`` takes."""
    p.add_argument("traces", nargs="+", metavar="TRACE", help="one trace file per rank")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory (created; must be empty if it exists)")
    p.add_argument("--gpus-per-server", type=int, default=1, metavar="G",
                   help="GPUs per server of the cluster to place the ranks on (default 1)")
    p.add_argument("--name", help="experiment name (default: the output directory's name)")
    p.add_argument("--axis", action="append", default=[], metavar="DESC=AXIS", type=_axis_pair,
                   help="schedule axis of a process group descriptor the importer does not "
                   "know (repeatable), e.g. --axis my_dp_group=dp")
    p.add_argument("--json", action="store_true", help="print what was imported as JSON")


def _axis_pair(text: str) -> tuple[str, str]:
    """One ``--axis DESC=AXIS`` (argparse refuses a malformed one with exit status 2)."""
    desc, sep, axis = text.partition("=")
    if not sep or not desc or not axis:
        raise argparse.ArgumentTypeError(f"wants DESC=AXIS, got {text!r}")
    return desc, axis


def cmd_import_kineto(args: argparse.Namespace) -> int:
    from pathlib import Path

    from workloads.captured import CaptureError
    from workloads.kineto import check_out_dir, import_traces, write_import

    try:
        check_out_dir(args.out)
        imported = fit_to_rails(import_traces(args.traces, gpus_per_server=args.gpus_per_server,
                                              step=args.step, axes=dict(args.axis)))
        name = args.name or Path(args.out).resolve().name
        files = write_import(imported, args.out, name)
    except CaptureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _report(imported, files, args.json)


def cmd_import_et(args: argparse.Namespace) -> int:
    from pathlib import Path

    from workloads.captured import CaptureError
    from workloads.exec_trace import import_ets
    from workloads.trace_common import check_out_dir, write_import

    try:
        check_out_dir(args.out)
        imported = fit_to_rails(import_ets(args.traces, gpus_per_server=args.gpus_per_server,
                                           axes=dict(args.axis)))
        files = write_import(imported, args.out, args.name or Path(args.out).resolve().name)
    except CaptureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _report(imported, files, args.json)


def fit_to_rails(imported: Imported) -> Imported:
    """``imported`` with the ports per rank and algorithms its groups need on optical rails
    (:func:`testbed.experiment.railfit.fit_rails`), each choice a note; raises
    :class:`~workloads.captured.CaptureError` naming the group no setting carries."""
    from testbed.experiment.railfit import fit_rails

    fit = fit_rails(imported.schedule)
    imported.schedule, imported.ports_per_rank = fit.schedule, fit.ports_per_rank
    imported.rail_notes = list(fit.notes)
    imported.notes = [*imported.notes, *fit.notes]
    return imported


def _report(imported: Any, files: list[Any], as_json: bool) -> int:
    """Print what an import wrote (text, or JSON with ``--json``)."""
    s = imported.schedule
    p = s.config.parallel
    groups = {"pp": p.pp, "dp": p.dp, "fsdp": p.fsdp, "tp": p.tp, "cp": p.cp, "ep": p.ep}
    summary = {"ranks": s.world_size, "cluster": {"servers": s.cluster.servers,
                                                  "gpus_per_server": s.cluster.gpus_per_server},
               "layouts": imported.layouts, "iteration": imported.step,
               "calls": imported.calls, "groups": groups,
               "ports_per_rank": imported.ports_per_rank,
               "algorithms": [list(a) for a in s.config.algorithms],
               "files": [str(f) for f in files], "notes": imported.notes}
    if as_json:
        print(json.dumps(summary, indent=1))
        return 0
    layouts = sorted(set(imported.layouts.values()))
    lo, hi = min(imported.calls.values()), max(imported.calls.values())
    print(f"imported {s.world_size} traces (layout {', '.join(layouts)}), {imported.step}: "
          f"{lo if lo == hi else f'{lo} to {hi}'} collective calls per rank")
    print("groups: " + ", ".join(f"{k} {v}" for k, v in groups.items() if v > 1))
    for note in imported.notes:
        print(f"note: {note}")
    print(f"schedule:   {files[0]}\nexperiment: {files[1]}  (opus-testbed run {files[1]} "
          "--backend sim)")
    return 0


def is_compare(argv: Sequence[str]) -> bool:
    """True for ``workload compare ...``."""
    return len(argv) >= 2 and argv[0] == "workload" and argv[1] == "compare"


def compare_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="opus-testbed workload compare",
        description="Two schedules side by side per rank: phases (axis, kind, calls, bytes), "
        "PP<->DP boundaries per iteration (within it, and cyclic: its last phase followed by "
        "its first), and every difference (phases aligned on axis and "
        "kind). A and B are schedule JSON files (workload --out, import kineto, a capture) or "
        "experiment files (generated, or workload: {schedule: FILE}). Exit 0 either way; 2 on "
        "bad input.")
    p.add_argument("a", metavar="A", help="first schedule (JSON) or experiment file")
    p.add_argument("b", metavar="B", help="second schedule (JSON) or experiment file")
    p.add_argument("--rank", type=int, action="append",
                   help="only this rank (repeatable; default every rank)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=cmd_compare)
    return p


def cmd_compare(args: argparse.Namespace) -> int:
    from workloads.compare import compare, load_any, render
    from workloads.errors import WorkloadConfigError

    try:
        report = compare(load_any(args.a), load_any(args.b), args.rank)
    except WorkloadConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, **report}, indent=1))
    else:
        print(render(report, args.a, args.b))
    return 0
