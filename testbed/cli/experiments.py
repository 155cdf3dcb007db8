"""``opus-testbed run | sweep | ladder | report | demo``: experiments from the command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from textwrap import fill
from typing import Any, NoReturn, TypeVar

from controller.railstate import SEMANTICS
from testbed.errors import Say, say_stderr
from testbed.experiment.backends import EMU, SELECTABLE
from testbed.experiment.config import (
    DEFAULT_SWEEP_DELAYS,
    MODES,
    RELAY_PATHS,
    SIM_COSTS,
    ExperimentConfig,
    RunSettings,
    load_experiment,
)
from testbed.metrics.degraded import (
    EXIT_DEGRADED,
    RESTS_ON,
    degraded_labels,
    exit_status,
    is_degraded,
    legend,
    mark,
)
from testbed.metrics.fit import SLOPE_MIN_DELAY_MS
from testbed.torchjob.config import TorchExperiment, is_torch_experiment, load_torch_experiment

REPO = Path(__file__).resolve().parents[2]
PERFETTO_HELP = ("also write trace.json into each run directory: the timeline for "
                 "ui.perfetto.dev (opus-testbed export perfetto)")


def make_say() -> Say:
    """Progress lines on stderr: rich with timestamps on a terminal, plain lines otherwise."""
    if sys.stderr.isatty():
        from rich.console import Console

        console = Console(stderr=True, highlight=False)
        return lambda msg: console.log(msg, markup=False)
    return say_stderr


def add_overrides(p: argparse.ArgumentParser, with_mode: bool = True) -> None:
    if with_mode:
        p.add_argument("--mode", choices=MODES, help="override the config's mode")
        p.add_argument("--delay", type=_delay,
                   help="switching delay: ms or a Table 3 technology name")
        p.add_argument("--semantics", choices=SEMANTICS,
                       help="override ocs.semantics: port-exact (one-to-one circuits, the "
                       "default) or rail-state (the public Opus artifact's bitmask model)")
        p.add_argument("--plane", choices=("opus", "static", "rotor"),
                       help="override controller.plane: opus (reconfigures "
                       "per collective phase, the default), static (a TopoOpt-style topology "
                       "set once from the job's traffic) or rotor (a RotorNet-style cycle of "
                       "matchings, --backend sim only); the rivals relay through GPUs, on the "
                       "emulator static with one port per rank (docs/validation.md)")
    p.add_argument("--iterations", type=int, help="measured iterations (after the warm-up)")
    p.add_argument("--warmup", type=int, help="warm-up iterations (the first one is profiled)")
    p.add_argument("--link-mbps", type=float,
                   help="emulated per-port rate in Mbit/s (default: calibrated for this machine)")
    p.add_argument("--ports-per-rank", type=int, help="OCS ports per GPU (K)")
    p.add_argument("--rotor-slot-ms", type=float,
                   help="the rotor plane's slot (default: max(10 x the switching delay, 0.1 ms))")
    p.add_argument("--relay-paths", choices=RELAY_PATHS,
                   help="override controller.relay_paths, the static plane's relay paths: fixed "
                   "(one per comm group and rank pair, from the topology; the default, both "
                   "backends) or dynamic (per transfer, the least-loaded hop now; sim only)")
    p.add_argument("--start-gate", choices=("on", "off"),
                   help="override run.start_gate: on, every emulated rank waits until all have "
                   "loaded before its first op (as NCCL's set-up is a collective)")
    p.add_argument("--wire-check", choices=("on", "off"),
                   help="override run.wire_check (default on): on, tcpdump captures every OCS "
                   "port of an emulated run and the verdict judges each switch's dark period "
                   "and the one-to-one rule from the capture (docs/wire.md)")
    p.add_argument("--no-spares", action="store_true",
                   help="run without the config's spare GPUs: a failed rank makes every rank "
                   "restart from the last completed iteration (after failover."
                   "migration_delay_s), as a job moved to a new rack would")
    p.add_argument("--ranks-per-process", choices=("rank", "server", "auto"),
                   help="override run.ranks_per_process: one replayer process per rank, one "
                   "per server (its ranks as threads, each in its own network namespace; "
                   "refused with failover), or server unless the run has failover (auto)")
    p.add_argument("--rank-cpu-quota", type=_quota, metavar="Q|auto|off",
                   help="override run.rank_cpu_quota: the rank processes' CPU quota as a "
                   "fraction of the machine (0 < Q <= 1), auto (all but what the fabric needs), "
                   "or off (emulated runs; needs a cgroup cpu controller)")
    add_time_dilation(p)
    p.add_argument("--backend", choices=SELECTABLE, default=EMU,
                   help="emu: real packets through Mininet/OVS (root); sim: the same schedule "
                   "and controller on a virtual clock")
    add_costs(p)


def add_costs(p: argparse.ArgumentParser) -> None:
    """``--costs``: the sim backend's cost model (overrides ``sim.costs``)."""
    p.add_argument("--costs", choices=SIM_COSTS,
                   help="override sim.costs, the sim backend's cost model: fabric (the "
                   "default: the modelled rails at rail_gbps with the real bytes, per-hop "
                   "latency, dark for exactly the switching delay, the controller's decision "
                   "time) or emulator (the emulator's measured costs at its scaled link, for "
                   "cross-validation)")


TIME_DILATION_HELP = (
    "override run.time_dilation: run every modelled time K times longer on the wall clock "
    "(compute, transfers at link rate / K, the switching delay, timeouts, fault times) so the "
    "emulator's own costs shrink by K in model time; every figure is reported in model time. "
    "auto (the default) picks the smallest K whose predicted bounds stay within half their "
    "limits and prints why. Emulated runs of replayed schedules only (a PyTorch job's compute "
    "cannot be dilated)")


def add_time_dilation(p: argparse.ArgumentParser) -> None:
    """``--time-dilation K|auto`` (run, sweep, demo, bench crossval)."""
    p.add_argument("--time-dilation", type=_time_dilation, metavar="K|auto",
                   help=TIME_DILATION_HELP)


def _time_dilation(text: str) -> float | str:
    """``--time-dilation``: ``auto`` or a factor >= 1, checked here (exit 2)."""
    from testbed.experiment.dilation import DilationError, parse_time_dilation

    try:
        return parse_time_dilation(text)
    except DilationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _delay(text: str) -> float | str:
    """``--delay``: ms or a Table 3 technology name, checked here so that a bad value is
    blamed on the command line (exit 2), not on the experiment file's key."""
    from controller.ocs import resolve_switching_delay_ms

    try:
        value: float | str = float(text)
    except ValueError:
        value = text
    try:
        resolve_switching_delay_ms(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return value


#: ``--rank-cpu-quota off``: no quota, whatever the experiment file says.
QUOTA_OFF = "off"


def _quota(text: str) -> float | str:
    """``--rank-cpu-quota``: a fraction, ``auto`` or ``off``, checked here (exit 2)."""
    from emulator.cpuquota import validate_setting

    if text in (QUOTA_OFF, "auto"):
        return text
    try:
        value = validate_setting(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"must be a fraction of the machine's CPU in (0, 1], "
                                         f"auto or off, got {text!r}") from exc
    assert value is not None
    return value


Settings = TypeVar("Settings", bound=RunSettings)


def apply_overrides(cfg: Settings, args: argparse.Namespace) -> Settings:
    changes: dict[str, Any] = {}
    if getattr(args, "mode", None):
        changes["mode"] = args.mode
    if getattr(args, "delay", None) is not None:
        changes["switching_delay"] = args.delay
    if getattr(args, "semantics", None):
        changes["semantics"] = args.semantics
    if getattr(args, "plane", None):
        changes["control_plane"] = args.plane
    if getattr(args, "rotor_slot_ms", None) is not None:
        changes["rotor_slot_ms"] = args.rotor_slot_ms
    if getattr(args, "relay_paths", None) is not None:
        changes["relay_paths"] = args.relay_paths
    for name in ("iterations", "warmup", "link_mbps", "ports_per_rank", "ranks_per_process"):
        if getattr(args, name, None) is not None:
            changes[name] = getattr(args, name)
    quota = getattr(args, "rank_cpu_quota", None)
    if quota is not None:
        changes["rank_cpu_quota"] = None if quota == QUOTA_OFF else quota
    if getattr(args, "start_gate", None) is not None:
        changes["start_gate"] = args.start_gate == "on"
    if getattr(args, "time_dilation", None) is not None:
        changes["time_dilation"] = args.time_dilation
    if getattr(args, "artifact_port", None) is not None:
        changes["artifact_port"] = args.artifact_port
    if getattr(args, "wire_check", None) is not None:
        changes["wire_check"] = args.wire_check == "on"
    if getattr(args, "costs", None) is not None:
        changes["sim_costs"] = args.costs
    if getattr(args, "no_spares", False) and isinstance(cfg, ExperimentConfig):
        changes["no_spares"] = True  # a torch job has no spares (nor faults) to go without
    return cfg.replace(**changes) if changes else cfg


def baseline_lines(summary: dict[str, Any], text: str) -> list[str]:
    """``run --baseline``'s one-screen summary: ``text`` (:func:`summary_text`) with the
    overhead marked when it rests on a degraded run, and a legend naming each one."""
    lines = text.splitlines()
    rests_on = summary.get(RESTS_ON) or []
    lines = [mark(line, rests_on) if line.startswith("baseline ") else line for line in lines]
    baseline = {"fidelity": summary.get("baseline_fidelity"),
                "fidelity_blame": summary.get("baseline_fidelity_blame"),
                "fidelity_reasons": summary.get("baseline_fidelity_reasons")}
    return lines + legend([("baseline", baseline), ("run", summary)])


def cmd_run(args: argparse.Namespace) -> int:
    from testbed.experiment.prepare import default_out_dir
    from testbed.results.summary import summary_text
    from testbed.studies.run import run_experiment

    cfg: ExperimentConfig | TorchExperiment = apply_overrides(
        load_torch_experiment(args.config) if is_torch_experiment(args.config)
        else load_experiment(args.config), args)
    out = Path(args.out) if args.out else default_out_dir(cfg)
    say = make_say()
    done = run_experiment(cfg, out, args.backend, say, baseline=args.baseline)
    summary = done.summary
    if args.perfetto:
        from testbed.cli.export import export_tree

        export_tree(done.root, say)
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
    elif done.has_baseline:
        print("\n".join(baseline_lines(summary, summary_text(summary))))
        print(f"results: {done.run_dir}")
    else:
        print(summary_text(summary))
        print(f"results: {done.run_dir}")
    if done.has_baseline:
        return exit_status(summary[RESTS_ON])
    return EXIT_DEGRADED if is_degraded(summary) else 0  # "simulated" is not degraded


def _delays_and_modes(args: argparse.Namespace) -> tuple[list[float], list[str]]:
    """``--delays`` (ms or Table 3 names, as ``--delay``) and ``--modes`` as lists; a bad
    value exits naming it."""
    from controller.ocs import parse_delays_ms

    try:
        delays = parse_delays_ms(args.delays)
    except ValueError as exc:
        _bad_option(f"argument --delays: {exc}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        _bad_option(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    return delays, modes


def _bad_option(message: str) -> NoReturn:
    """Refuse a bad option value as argparse does: the message, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def cmd_sweep(args: argparse.Namespace) -> int:
    from testbed.studies.sweep import SweepError, run_sweep

    cfg = apply_overrides(load_experiment(args.config), args)
    delays, modes = _delays_and_modes(args)
    semantics = ([s.strip() for s in args.semantics_list.split(",") if s.strip()]
                 if args.semantics_list is not None else None)
    out = Path(args.out) if args.out else Path("results") / (
        f"{cfg.name}-sweep-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        planes = [p.strip() for p in args.planes.split(",") if p.strip()]
        rows = run_sweep(cfg, delays, modes, out, args.backend, args.workers, make_say(),
                         engine=args.engine, semantics=semantics, reference=args.reference,
                         planes=planes)
    except SweepError as exc:  # a bad option: nothing was run
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.perfetto:
        from testbed.cli.export import export_tree

        export_tree(out, make_say())
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
    else:
        print("\n".join(sweep_lines(rows, json.loads((out / "sweep.json").read_text()))))
        print(f"results: {out}")
    return exit_status(degraded_labels((r["point"], r) for r in rows))


def _cell(value: Any, fmt: str, rests_on: Any) -> str:
    """A figure as printed in a table: formatted, then :data:`MARK` if it rests on a
    degraded run, else a space (so marked and unmarked figures line up)."""
    if value in (None, ""):
        return " "
    text = format(float(value), fmt)
    return mark(text, rests_on) if rests_on else text + " "


def sweep_lines(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """``sweep``'s table, its families' slopes and 100 ms overheads (``meta``: sweep.json),
    each figure marked when it rests on a degraded run, and the legend naming those runs."""
    lines = [f"{'mode':<14}{'semantics':<12}{'delay_ms':>9}{'iteration_s':>14}"
             f"{'overhead_%':>13}  fidelity"]
    for r in rows:
        own = degraded_labels([(r["point"], r)])
        lines.append(f"{r['mode']:<14}{r['semantics']:<12}{float(r['delay_ms']):>9g}"
                     f"{_cell(r.get('iteration_time_s'), '.3f', own):>14}"
                     f"{_cell(r.get('overhead_pct'), '+.2f', r.get(RESTS_ON)):>13}  "
                     f"{r.get('fidelity', '')}")
    if any(r["mode"] == "baseline" for r in rows):
        lines.append("0 ms is the baseline: electrical rails, no OCS; each overhead_% is "
                     "against it")
    for fam in meta["families"]:
        name = f"{fam['mode']}, {fam['semantics']}" if fam["semantics"] else fam["mode"]
        lines.append(f"{name}: {_slope_text(fam, rows)}, "
                     f"{_overhead_100_text(fam)}")
    return lines + legend((r["point"], r) for r in rows)


def _slope_text(fam: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The family's slope, or why there is none and which delays would give one."""
    slope = fam["slope_s_per_s"]
    if slope is not None:
        return (f"slope {mark(format(slope, '.2f'), fam.get('slope_rests_on_degraded', []))} "
                f"s/s (>= {SLOPE_MIN_DELAY_MS:g} ms)")
    delays = sorted({float(r["delay_ms"]) for r in rows if r["mode"] == fam["mode"]
                     and (r["semantics"] or "") == fam["semantics"]})
    have = [d for d in delays if d >= SLOPE_MIN_DELAY_MS]
    ok = int(fam.get("slope_points") or 0)
    if len(have) >= 2:
        why = f"only {ok} of its {len(have)} succeeded"
    elif have:
        why = f"this sweep has one, {have[0]:g} ms"
    else:
        largest = f" (its largest is {delays[-1]:g} ms)" if delays else ""
        why = f"this sweep has none{largest}"
    return (f"slope n/a (needs 2 delays >= {SLOPE_MIN_DELAY_MS:g} ms, where exposed switching "
            f"dominates; {why}: add --delays ...,250,500)")


def _overhead_100_text(fam: dict[str, Any]) -> str:
    ov100 = fam["overhead_100ms_pct"]
    if ov100 is None:
        return "overhead at 100 ms n/a (no measured 100 ms point with a baseline)"
    return (f"overhead at 100 ms "
            f"{mark(format(ov100, '+.1f'), fam.get('overhead_100ms_rests_on_degraded', []))} %")


def _pct(value: float | None, fmt: str = "+.1f") -> str:
    return "n/a" if value is None else format(value, fmt)


def cmd_ladder(args: argparse.Namespace) -> int:
    from testbed.studies.ladder import LadderError, run_ladder
    from testbed.studies.sweep import SweepError

    cfg = apply_overrides(load_experiment(args.config), args)
    delays, modes = _delays_and_modes(args)
    rungs = [r.strip() for r in args.rungs.split(",") if r.strip()] if args.rungs else None
    out = Path(args.out) if args.out else Path("results") / (
        f"{cfg.name}-ladder-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        ladder = run_ladder(cfg, out, delays, modes, args.workers, rungs, make_say())
    except (LadderError, SweepError) as exc:  # a bad option: nothing was run
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(ladder, indent=1, default=str))
    else:
        print("\n".join(ladder_lines(ladder)))
        print(f"results: {out} (ladder.json)")
    return exit_status(ladder[RESTS_ON])


def ladder_lines(ladder: dict[str, Any]) -> list[str]:
    """``ladder``'s table: per rung and mode the 100 ms overhead, the slope and their deltas
    from as-written, each marked when it rests on a degraded run, then the legend."""
    def cell(value: float | None, fmt: str, rests_on: Any) -> str:
        return "n/a " if value is None else _cell(value, fmt, rests_on)

    ov_key, slope_key = "overhead_100ms_rests_on_degraded", "slope_rests_on_degraded"
    lines = [f"{'rung':<30}{'baseline_s':>12}  {'mode':<13}{'ovh@100ms_%':>13}{'delta':>9}"
             f"{'slope_s/s':>11}{'delta':>9}"]
    for r in ladder["rungs"]:
        if r.get("not_run"):
            lines.append(f"{r['rung']:<30}{'':>12}  n/a ({r['not_run']}): not run")
            continue
        for i, (mode, fam) in enumerate(r["modes"].items()):
            d = r["delta"][mode]
            base = cell(r["baseline_s"], ".3f",
                        r.get("baseline_rests_on_degraded")) if i == 0 else ""
            lines.append(
                f"{r['rung'] if i == 0 else '':<30}{base:>12}  {mode:<13}"
                f"{cell(fam['overhead_100ms_pct'], '+.1f', fam.get(ov_key)):>13}"
                f"{cell(d['overhead_100ms_pct'], '+.1f', d.get(ov_key)):>9}"
                f"{cell(fam['slope_s_per_s'], '.2f', fam.get(slope_key)):>11}"
                f"{cell(d['slope_s_per_s'], '+.2f', d.get(slope_key)):>9}")
    return lines + legend(ladder.get("degraded_runs", {}).items())


def cmd_report(args: argparse.Namespace) -> int:
    from testbed.results.store import report

    try:
        written = report(Path(args.dir))
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


#: How the demo names the modes of the paper's Fig. 8 figures.
FIG8_MODE_TEXT = {"on-demand": "on demand", "provisioning": "with provisioning"}


def paper_fig8_text() -> str:
    """The paper's Fig. 8 overheads at 100 ms, from :mod:`testbed.results.reference`."""
    from testbed.results.reference import PAPER_FIG8_100MS_PCT

    return ", ".join(f"{pct:+.1f} % {FIG8_MODE_TEXT.get(mode, mode)}"
                     for mode, pct in PAPER_FIG8_100MS_PCT.items())


def demo_lines(title: str, summaries: dict[str, dict[str, Any]],
               artifact: dict[str, dict[str, Any]], delay_ms: float) -> list[str]:
    """The demo's table (one row per run of :data:`~testbed.studies.demo.DEMO_RUNS`) and the
    lines saying which model the paper's Fig. 8 assumed, with the figures of the artifact's
    run under that model (``artifact``: label -> summary). Both sets of summaries carry their
    overheads (:func:`testbed.results.baseline.against_baseline`)."""
    from testbed.metrics.wire import wire_text
    from testbed.results.baseline import overhead_text, rail_state_comparison
    from testbed.studies.demo import ARTIFACT_CONFIG, BASELINE, RAIL_STATE_LABELS

    lines = [title, f"{'run':<25}{'iteration_s':>12}{'overhead':>10}{'reconfigs/it':>14}"
             f"{'exposed_s/it':>14}  fidelity"]
    for label, s in summaries.items():
        lines.append(f"{label:<25}{_pct(s.get('iteration_time_s'), '.3f'):>12}"
                     f"{overhead_text(s):>10}"
                     f"{_pct(s.get('reconfigurations_per_iteration'), '.1f'):>14}"
                     f"{_pct(s.get('exposed_reconfig_s'), '.3f'):>14}  {s.get('fidelity')}")
    artifact_base = artifact.get(BASELINE, {})
    target = artifact_base.get("calibrate_step_s")
    comparison = rail_state_comparison(summaries, artifact, RAIL_STATE_LABELS, BASELINE)
    lines += [
        f"paper Fig. 8 at 100 ms ({paper_fig8_text()}) assumes its authors' rail-state model "
        "(their artifact's controller: a bitmask per rail, requests at phase changes; not a "
        "one-to-one OCS).",
        f"Under rail-state, the artifact's own run ({_repo_path(ARTIFACT_CONFIG)}, "
        + (f"calibrated to a {target:g} s step, " if target is not None else "")
        + f"sim backend, {_pct(artifact_base.get('iteration_time_s'), '.2f')} s baseline) gives "
        + " / ".join(overhead_text(artifact.get(x)) for x in RAIL_STATE_LABELS)
        + f" at {delay_ms:g} ms; {comparison} (docs/validation.md)."]
    lines += [f"wire {label}: {wire_text(s['wire'])}" for label, s in summaries.items()
              if s.get("wire") is not None]
    if any(_exposed_over_overhead(s) for s in summaries.values()):
        lines.append("exposed_s/it can exceed the overhead: it counts every rank's waits for "
                     "light, also while other ranks computed or sent "
                     "(exposed_reconfig_overlapped_s); only critical-path waits lengthen the "
                     "iteration")
    degraded = {label: s for label, s in summaries.items() if is_degraded(s)}
    for label, s in degraded.items():
        lines.append(f"degraded {label} (blamed on the {s.get('fidelity_blame', 'run')}): "
                     + "; ".join(s.get("fidelity_reasons", [])))
    if degraded:
        lines.append(f"exit status 3: {len(degraded)} of {len(summaries)} rows are degraded; "
                     "their figures are kept but not to be trusted alone (README, Fidelity)")
    return lines


def _exposed_over_overhead(s: dict[str, Any]) -> bool:
    t, base, exposed = (s.get(k) for k in ("iteration_time_s", "baseline_iteration_time_s",
                                           "exposed_reconfig_s"))
    if t is None or base is None or exposed is None:
        return False
    return bool(exposed > t - base)


def _repo_path(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (as the README names it)."""
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def cmd_demo(args: argparse.Namespace) -> int:
    """Baseline vs OCS on demand, with provisioning, degree-aware, and under the artifact's
    rail-state model, at one switching delay."""
    if args.ocs_only:
        from emulator.demo import run_demo as run_ocs_demo

        return run_ocs_demo()
    from testbed.studies.demo import run_demo

    out = Path(args.out) if args.out else Path("results") / (
        f"demo-{time.strftime('%Y%m%d-%H%M%S')}")
    t0 = time.monotonic()
    demo = run_demo(out, make_say(), args.delay, time_dilation=args.time_dilation)
    cfg = demo.config
    print()
    print("\n".join(demo_lines(f"== opus-testbed demo: {cfg.name}, "
                               f"{cfg.workload.cluster.world_size} ranks, switching delay "
                               f"{demo.delay_ms:g} ms ==", demo.summaries, demo.artifact,
                               demo.delay_ms)))
    print(f"results and plots: {out} ({time.monotonic() - t0:.0f} s)")
    return EXIT_DEGRADED if any(is_degraded(s) for s in demo.summaries.values()) else 0


def register(sub: Any) -> None:
    """Add ``run``, ``sweep``, ``ladder``, ``report`` and ``demo`` to the top-level parser."""
    for add in (_add_run, _add_sweep, _add_ladder, _add_report, _add_demo):
        add(sub)


def _add_run(sub: Any) -> None:
    """``run``: one experiment end to end, optionally after its baseline."""
    p = sub.add_parser(
        "run", help="run one experiment end to end (emulated: root)",
        description="Replay training iterations of CONFIG as real traffic through Opus-"
        "controlled emulated rails (or the simulation backend), then write the results "
        "directory: manifest.json, summary.json, tables (CSV), plots (PNG). A PyTorch script's "
        "experiment (workload: {torch: ...}, or {torchtitan: ...} for TorchTitan's trainer) "
        "trains the script itself, on loopback and then on "
        "the rails, and fails unless every loss is identical (loss_max_abs_diff). Exit status: "
        "0 ok (or simulated: --backend sim runs are not judged), 2 bad input: a bad file or "
        "option, a job the rails cannot carry (each comm group's circuits against the ports "
        "per rank), a busy --out; every check of both runs comes before the baseline starts, "
        "so nothing started and nothing was written, 1 the run failed, 3 fidelity degraded "
        "(with --baseline: the run or its baseline; the overhead is then marked * and "
        "rests_on_degraded names them).")
    p.add_argument("config", help="experiment YAML (e.g. examples/llama3-8b.yaml)")
    p.add_argument("--out", help="results directory (default results/NAME-MODE-DELAY-TIME); "
                   "must not exist or be empty")
    p.add_argument("--baseline", action="store_true",
                   help="also run the electrical baseline first and report the overhead")
    p.add_argument("--json", action="store_true", help="print summary.json instead of a table")
    p.add_argument("--perfetto", action="store_true", help=PERFETTO_HELP)
    p.add_argument("--artifact-port", type=int, metavar="PORT",
                   help="set artifact_protocol.port: the controller also serves the public Opus "
                   "artifact's line protocol on this TCP port of the run's frontend address (0: "
                   "a free one) and the emulated ranks speak it (docs/artifact-protocol.md)")
    add_overrides(p)
    p.set_defaults(func=cmd_run)


def _add_sweep(sub: Any) -> None:
    """``sweep``: iteration time against switching delay per mode and semantics."""
    p = sub.add_parser(
        "sweep", help="iteration time vs switching delay per mode (paper Fig. 8)",
        description="Run CONFIG for every semantics, mode and delay (the baseline once), write "
        "sweep.csv (mode, semantics, delay_ms, iteration_time_s, overhead_pct), sweep.json "
        "(with each family's slope of step time against delay over the points >= 250 ms and "
        "its overhead at 100 ms, and the public Opus artifact's figures when the workload is "
        "the artifact's or with --reference), one run directory per point and "
        "iteration_vs_delay.png (axes scaled to the data, degraded points ringed). A figure "
        "that rests on a degraded run (its point, or the baseline for an overhead) is marked "
        "* in the table, with the runs' reasons below, and listed under rests_on_degraded in "
        "sweep.csv and sweep.json. Exit status: "
        "0 ok (a --backend sim sweep is never degraded), 3 some point degraded, 2 bad option "
        "(nothing run).")
    p.add_argument("config", help="experiment YAML")
    p.add_argument("--delays", default=DEFAULT_SWEEP_DELAYS,
                   help="switching delays, each ms or a Table 3 technology name as --delay "
                   "takes (e.g. 0,sip,mems,100); 0 stands for the electrical baseline, and a "
                   "slope needs two >= 250 ms (default %(default)s)")
    p.add_argument("--modes", default="baseline,on-demand,provisioning",
                   help=f"comma-separated modes among {', '.join(MODES)}")
    p.add_argument("--semantics", dest="semantics_list",
                   help="comma-separated controller semantics among "
                   f"{', '.join(SEMANTICS)} (default: the config's ocs.semantics); each runs "
                   "every mode and delay")
    p.add_argument("--planes", default="opus",
                   help="comma-separated control planes among opus, static, rotor: opus runs "
                   "--modes; static and rotor each run every delay as a curve of their own "
                   "(e.g. --planes opus,static,rotor; default %(default)s). --backend emu runs "
                   "opus and static (one port per rank), not the rotor")
    p.add_argument("--out", help="sweep directory (default results/NAME-sweep-TIME)")
    p.add_argument("--workers", type=int, default=2,
                   help="parallel points with --backend sim (emulated points run one by one)")
    p.add_argument("--engine", choices=("process", "ray", "dask"), default="process",
                   help="where simulated points run: a local process pool, or an existing Ray "
                   "or Dask cluster (pip extras opus-testbed[ray] / [dask])")
    p.add_argument("--reference", action="store_true",
                   help="draw the public Opus artifact's Llama3-8B points on the plot even when "
                   "the workload is not the artifact's (they are drawn when it is)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--perfetto", action="store_true", help=PERFETTO_HELP)
    add_overrides(p, with_mode=False)
    p.set_defaults(func=cmd_sweep)


def _add_ladder(sub: Any) -> None:
    """``ladder``: the overhead's model differences, one at a time."""
    from testbed.studies.ladder import RUNG_NAMES

    p = sub.add_parser(
        "ladder", help="the overhead's model differences, one at a time (sim backend)",
        description="Run CONFIG (normally examples/llama3-8b-artifact.yaml) as a simulated "
        "sweep once as written and once per rung, each rung changing one modelling choice "
        f"({', '.join(RUNG_NAMES[1:])}); print per rung and mode the overhead at 100 ms and "
        "the slope of step time against delay (>= 250 ms) and their differences from the "
        "experiment as written; write ladder.json and each rung's sweep under --out. "
        "no-controller-baseline reuses the as-written points against a baseline where no call "
        "asks the controller. A figure that rests on a degraded run is marked * and listed "
        "under rests_on_degraded in ladder.json (simulated runs never are). Exit status: 0 "
        "ok, 3 some figure rests on a degraded run, 2 bad option (nothing run).")
    p.add_argument("config", help="experiment YAML")
    p.add_argument("--delays", default="100,250,1000,3000",
                   help="switching delays, each ms or a Table 3 technology name as --delay "
                   "takes (include 100 and two >= 250 ms for the figures)")
    p.add_argument("--modes", default="on-demand,provisioning",
                   help=f"comma-separated modes among {', '.join(MODES)}")
    p.add_argument("--rungs", help="comma-separated rungs to run besides as-written "
                   f"(default: all): {', '.join(RUNG_NAMES[1:])}")
    p.add_argument("--out", help="ladder directory (default results/NAME-ladder-TIME)")
    p.add_argument("--workers", type=int, default=2, help="parallel simulated points")
    p.add_argument("--json", action="store_true", help="print ladder.json")
    p.add_argument("--iterations", type=int, help="measured iterations (after the warm-up)")
    p.add_argument("--warmup", type=int, help="warm-up iterations (the first one is profiled)")
    add_costs(p)
    p.set_defaults(func=cmd_ladder)


def _add_report(sub: Any) -> None:
    """``report``: redraw the plots of a results directory."""
    p = sub.add_parser("report", help="redraw the plots of a run or sweep directory",
                       description=fill("Re-render the PNG plots from a results directory's CSV "
                       "files: a run, a sweep and its runs, or run --baseline's folder (its "
                       "baseline/ and MODE/ runs). Exit 2 if DIR holds none of them (the "
                       "message names the results folders inside it)."),
                       epilog="examples:\n"
                       "  opus-testbed report results/my-sim     # run --baseline's folder\n"
                       "  opus-testbed report results/my-sweep   # the sweep and its runs\n",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="results directory")
    p.set_defaults(func=cmd_report)


def _add_demo(sub: Any) -> None:
    """``demo``: the demo's runs side by side."""
    p = sub.add_parser("demo", help="baseline vs OCS with/without provisioning (root)",
                       description="Run examples/demo.yaml six times on emulated rails "
                       "(electrical baseline; a one-to-one OCS on demand, with provisioning and "
                       "degree-aware with K=2; the public artifact's rail-state model on demand "
                       "and with provisioning) and print the iteration times side by side, "
                       "with the line saying which model the paper's Fig. 8 assumed. Exit "
                       "status: 0 every row ok, 3 some row degraded (each is named with its "
                       "reason), 1 a run failed.")
    p.add_argument("--delay", type=_delay,
                   help="switching delay: ms or a Table 3 technology name")
    p.add_argument("--out", help="results directory (default results/demo-TIME)")
    p.add_argument("--ocs-only", action="store_true",
                   help="instead, the emulated OCS alone, step by step (the first demo)")
    add_time_dilation(p)
    p.set_defaults(func=cmd_demo)
