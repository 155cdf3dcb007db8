"""``opus-testbed workload CONFIG``: generate a schedule and summarise one rank's phases.

CONFIG may also name a schedule file (``workload: {schedule: FILE}``: a capture or an import),
which is loaded instead of generated.

The lead's CLI calls :func:`add_arguments` on its sub-parser and :func:`run` with the parsed
arguments; ``run`` returns the exit code (2 for a configuration error).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from typing import Any, TextIO

from workloads.errors import WorkloadConfigError
from workloads.loader import load_timing, load_workload_source
from workloads.models import total_params
from workloads.schedule import Schedule
from workloads.timing import TimedPhase, TimingModel, timed_phases, windows

MIB = 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``workload`` command's arguments."""
    parser.add_argument("config", help="experiment YAML with a top-level 'workload:' mapping")
    parser.add_argument("--rank", type=int, default=0, help="rank whose phases to show")
    parser.add_argument("--out", help="write the schedule as JSON to this path")
    parser.add_argument("--json", action="store_true", help="print a JSON object")
    parser.add_argument("--summary", action="store_true",
                        help="print the human summary (the default without --json)")
    parser.add_argument("--scale-up", action="store_true",
                        help="also list phases of intra-server (NVLink) collectives")
    parser.add_argument("--rail-gbps", type=float, default=None,
                        help="rail bandwidth for the modeled start times and for "
                        "workload.calibrate_step_s (Gbit/s; default: the file's "
                        f"network.rail_gbps, as run uses it, else {TimingModel.rail_gbps:g})")


def axis_totals(schedule: Schedule, rank: int) -> dict[str, dict[str, Any]]:
    """Per group axis (``fsdp``, not its paper-level family ``dp``) and kind: calls, message
    and wire bytes of ``rank``'s collectives."""
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"calls": 0, "message_bytes": 0,
                                                          "wire_bytes": 0, "scale_up": True})
    for op in schedule.ops_of(rank):
        if op.is_collective:
            t = out[f"{op.axis}/{op.kind}"]
            t["calls"] += 1
            t["message_bytes"] += op.size_bytes
            t["wire_bytes"] += op.wire_bytes
            t["scale_up"] = t["scale_up"] and op.scale_up
    return dict(sorted(out.items()))


def report(schedule: Schedule, rank: int, model: TimingModel,
           include_scale_up: bool = False) -> dict[str, Any]:
    """The JSON-able summary the command prints."""
    phases, iteration_s = timed_phases(schedule, rank, model, include_scale_up)
    win = windows(phases)
    cfg = schedule.config
    origin = (schedule.origin or {}).get("kind", "captured")
    return {
        "model": cfg.model.name if cfg.model else f"{origin} schedule",
        "params": total_params(cfg.model) if cfg.model else None,
        "ranks": schedule.world_size,
        "ops": schedule.op_count,
        "rank": rank,
        "server": schedule.server_of(rank),
        "rail": schedule.rail_of(rank),
        "parallelism": {k: getattr(cfg.parallel, k) for k in
                        ("tp", "sp", "dp", "fsdp", "pp", "pp_schedule", "virtual_stages",
                         "cp", "ep")},
        "modeled_iteration_s": iteration_s,
        "rail_gbps": model.rail_gbps,
        "activation_checkpointing": cfg.activation_checkpointing,
        "calibrate_step_s": cfg.calibrate_step_s,
        "compute_scale": cfg.compute_scale,
        "phases": [_phase_json(p) for p in phases],
        "totals": axis_totals(schedule, rank),
        "windows": {"count": len(win), "over_1ms": sum(w > 1e-3 for w in win),
                    "modeled_s": win},
    }


def _phase_json(tp: TimedPhase) -> dict[str, Any]:
    d = tp.phase.to_dict()
    d.pop("op_indices")
    d.pop("collective_ids")
    d["modeled_start_s"] = tp.start_s
    d["modeled_end_s"] = tp.end_s
    return d


def print_summary(rep: dict[str, Any], out: TextIO) -> None:
    """Human-readable form of :func:`report`."""
    p = rep["parallelism"]
    params = f"{rep['params'] / 1e9:.2f} B params" if rep["params"] else "no model"
    print(f"{rep['model']} ({params}) on {rep['ranks']} ranks: "
          f"tp={p['tp']}{'+sp' if p['sp'] else ''} dp={p['dp']} fsdp={p['fsdp']} "
          f"pp={p['pp']} ({p['pp_schedule']}, v={p['virtual_stages']}) cp={p['cp']} "
          f"ep={p['ep']}", file=out)
    print(f"ops (all ranks): {rep['ops']:,}   modeled iteration: "
          f"{rep['modeled_iteration_s'] * 1e3:.1f} ms on {rep['rail_gbps']:g} Gbit/s rails",
          file=out)
    if rep["calibrate_step_s"] is not None:
        print(f"compute x{rep['compute_scale']:.4f}: calibrated to a "
              f"{rep['calibrate_step_s']:g} s step", file=out)
    print(f"\nrank {rep['rank']} (server {rep['server']}, rail {rep['rail']}) phases:", file=out)
    print(f"  {'#':>3} {'axis':7} {'kind':13} {'calls':>5} {'message MiB':>12} "
          f"{'per call MiB':>12} {'wire MiB':>10} {'start ms':>10}", file=out)
    for i, ph in enumerate(rep["phases"]):
        axes = "+".join(ph.get("axes") or [ph["axis"]])
        print(f"  {i:>3} {axes:7} {ph['kind']:13} {ph['calls']:>5} "
              f"{ph['message_bytes'] / MIB:>12.2f} {ph['max_call_bytes'] / MIB:>12.2f} "
              f"{ph['wire_bytes'] / MIB:>10.2f} {ph['modeled_start_s'] * 1e3:>10.2f}"
              f"{'  (scale-up)' if ph['scale_up'] else ''}", file=out)
    print("\ntotals per axis:", file=out)
    for key, t in rep["totals"].items():
        where = "scale-up" if t["scale_up"] else "rails"
        print(f"  {key:22} {t['calls']:>6} calls {t['message_bytes'] / MIB:>12.2f} MiB "
              f"message {t['wire_bytes'] / MIB:>12.2f} MiB wire  ({where})", file=out)
    w = rep["windows"]
    print(f"\nwindows: {w['count']} ({w['over_1ms']} over 1 ms, modeled)", file=out)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Execute the command; returns the exit code."""
    out = out or sys.stdout
    try:
        timing = load_timing(args.config)
        if args.rail_gbps is not None:
            if args.rail_gbps <= 0:
                raise WorkloadConfigError("must be positive", "--rail-gbps", "command line")
            timing = dataclasses.replace(timing, rail_gbps=args.rail_gbps)
        source = load_workload_source(args.config, timing)
        schedule = source.schedule()
    except WorkloadConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not 0 <= args.rank < schedule.world_size:
        print(f"error: --rank must be in 0..{schedule.world_size - 1}", file=sys.stderr)
        return 2
    if args.out:
        schedule.to_json(args.out)
    rep = report(schedule, args.rank, timing, args.scale_up)
    if args.json:
        json.dump(rep, out, indent=1)
        out.write("\n")
    else:
        print_summary(rep, out)
        if args.out:
            print(f"schedule written to {args.out}", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="opus-testbed workload", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
