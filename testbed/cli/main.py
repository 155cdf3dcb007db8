"""The ``opus-testbed`` command line.

Sub-commands import their modules lazily, so ``--help`` and pure commands work without root,
Mininet or os-ken.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from testbed.cli.traces import compare_parser, is_compare

EPILOG = """\
examples:
  opus-testbed check                 # prerequisites, with a fix for each failure
  opus-testbed run examples/llama3-8b.yaml --baseline   # one experiment end to end (root)
  opus-testbed sweep examples/llama3-8b.yaml --delays 0,10,100   # paper Fig. 8 (root)
  opus-testbed report results/DIR    # redraw the plots of a run or sweep
  opus-testbed export perfetto results/DIR   # the run as a trace for ui.perfetto.dev
  opus-testbed compare results/A results/B   # two runs (or sweeps) side by side
  opus-testbed demo                  # baseline vs OCS +/- provisioning (root)
  opus-testbed bench fidelity --json # data-plane dark period vs injected delay (root)
  opus-testbed bench control --json  # OCS app overhead beyond the delay (root)
  opus-testbed bench tcp --json      # TCP between two ranks vs the link rate (root)
  opus-testbed bench alltoall --json # all-to-all as matchings vs multihop vs electrical
  opus-testbed bench stragglar --json  # StragglAR vs Ring with a persistent straggler
  opus-testbed bench failover --json # spare-GPU failover: recovery per switching delay (root)
  opus-testbed workload examples/llama3-8b-workload.yaml
  opus-testbed workload compare A.yaml B.json   # two schedules side by side
  opus-testbed import kineto rank*.json.gz --out imported/   # profiler traces -> workload
  opus-testbed import et rank*.json --out imported/   # execution traces -> workload
  opus-testbed clean                 # remove leftovers of crashed runs (ours only)
"""


def _refuse(message: str) -> NoReturn:
    """A bad option value: the message on stderr, exit status 2 (as argparse's own)."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def _cmd_check(args: argparse.Namespace) -> int:
    from testbed.check import run_checks

    checks = run_checks()
    if args.json:
        print(json.dumps({"ok": all(c.passes for c in checks),
                          "checks": [c.to_json() for c in checks]}, indent=1))
    else:
        for c in checks:
            print(f"[{'ok' if c.ok else 'FAIL' if not c.optional else 'off'}] {c.name}: "
                  f"{c.detail}")
            if not c.ok and c.fix:
                print(f"       fix: {c.fix}")
    return 0 if all(c.passes for c in checks) else 1


def _cmd_clean(args: argparse.Namespace) -> int:
    from emulator import vswitchd_priority
    from emulator.runstate import clean

    removed: dict[str, Any] = dict(clean(include_live=args.all))
    restored = vswitchd_priority.release(everyone=args.all)
    if args.json:
        print(json.dumps({**removed, "vswitchd_policy_restored": restored}, indent=1))
        return 0
    for kind, items in removed.items():
        for item in items:
            print(f"removed {kind.removesuffix('es') if kind == 'processes' else kind[:-1]}: "
                  f"{item}")
    if restored:
        print("restored ovs-vswitchd's former scheduling policy")
    if not restored and not any(removed.values()):
        print("nothing to clean")
    return 0


def _print_bench(result: dict[str, Any], as_json: bool) -> None:
    """A benchmark's result: JSON, or one line per key (a row per line for lists of rows).
    Figures that rest on a degraded run (the result's ``degraded_figures``, rows with a
    ``rests_on_degraded``) are marked, with a legend naming those runs' reasons."""
    from testbed.metrics.degraded import MARK, RESTS_ON, legend

    if as_json:
        print(json.dumps(result, indent=1))
        return
    marked = set(result.get("degraded_figures") or ())
    for key, value in result.items():
        if isinstance(value, list) and value and all(isinstance(row, dict) for row in value):
            if key != "results":
                print(f"{key}:")
            for row in value:
                print(f"{MARK if row.get(RESTS_ON) else ' '} "
                      + ", ".join(f"{k}={v}" for k, v in row.items()))
        else:
            print(f"{key}: {value}{MARK if key in marked else ''}")
    for line in legend((result.get("degraded_runs") or {}).items()):
        print(line)


def _bench_fidelity(args: argparse.Namespace) -> dict[str, Any]:
    from emulator.bench import run_fidelity_bench
    from testbed.metrics.darktime import with_tolerances

    result = run_fidelity_bench(delays_ms=_floats(args.delays), switches=args.switches,
                                interval_us=args.interval_us)
    with_tolerances(result["results"])
    return result


def _bench_control(args: argparse.Namespace) -> dict[str, Any]:
    from emulator.bench import run_control_bench

    return run_control_bench(port_counts=[int(p) for p in _floats(args.ports)],
                             repeats=args.repeats)


def _bench_counters(args: argparse.Namespace) -> dict[str, Any]:
    from emulator.bench import run_counters_bench

    return run_counters_bench(ports=args.ports, repeats=args.repeats)


def _bench_tcp(args: argparse.Namespace) -> dict[str, Any]:
    from emulator.bench import run_tcp_bench

    return run_tcp_bench(link_mbps=args.link_mbps, nbytes=args.bytes, trials=args.trials,
                         late_s=args.late_ms / 1e3)


def _bench_ranks(args: argparse.Namespace) -> dict[str, Any]:
    from pathlib import Path

    from testbed.results.rankcompare import compare_dirs

    return compare_dirs(Path(args.a), Path(args.b))


def _bench_workload(_args: argparse.Namespace) -> dict[str, Any]:
    from workloads.bench import run_workload_bench

    return run_workload_bench()


def _bench_crossval(args: argparse.Namespace) -> dict[str, Any]:
    from pathlib import Path

    from controller.railstate import SEMANTICS
    from testbed.studies.crossval import run_crossval, run_crossval_points

    keep = Path(args.keep) if args.keep else None
    overrides = {k: v for k, v in (("time_dilation", args.time_dilation),
                                   ("mode", args.mode)) if v is not None} or None
    if args.semantics is None and args.delays is None:
        return run_crossval(args.config, work_dir=keep, sim_seeds=args.seeds,
                            overrides=overrides)
    from testbed.experiment.config import load_experiment

    cfg = load_experiment(args.config)
    semantics = ([s.strip() for s in args.semantics.split(",") if s.strip()]
                 if args.semantics is not None else [cfg.semantics])
    bad = [s for s in semantics if s not in SEMANTICS]
    if bad or not semantics:
        _refuse(f"opus-testbed: error: unknown semantics {bad}; choose from "
                f"{', '.join(SEMANTICS)}")
    delays = _floats(args.delays) if args.delays is not None else [cfg.switching_delay_ms]
    return run_crossval_points(args.config, semantics, delays, work_dir=keep,
                               sim_seeds=args.seeds, overrides=overrides)


def _bench_sim(args: argparse.Namespace) -> dict[str, Any]:
    from testbed.simulator.bench import run_sim_benches

    mirror = {"auto": None, "on": True, "off": False}[args.mirror]
    if args.rails < 1 or args.rails > 8:
        _refuse(f"opus-testbed: error: --rails must be in 1..8, got {args.rails}")
    if mirror and args.rails > 1:
        _refuse(f"opus-testbed: error: --mirror on simulates rail 0 only, got --rails "
                f"{args.rails}")
    return run_sim_benches([int(g) for g in args.gpus.split(",") if g.strip()], mode=args.mode,
                           switching_delay_ms=args.delay, mirror=mirror, rails=args.rails,
                           costs=args.costs)


def _bench_alltoall(args: argparse.Namespace) -> dict[str, Any]:
    from pathlib import Path

    from testbed.studies.collective_bench import run_alltoall_bench

    return run_alltoall_bench(
        ranks=[int(n) for n in _floats(args.ranks)], emu_ranks=args.emu_ranks,
        size_mib=args.size_mib, delays_ms=_floats(args.delays),
        backends=_names(args.backends), iterations=args.iterations, plot=Path(args.plot),
        work_dir=Path(args.keep) if args.keep else None)


def _bench_stragglar(args: argparse.Namespace) -> dict[str, Any]:
    from pathlib import Path

    from testbed.studies.collective_bench import run_stragglar_bench

    return run_stragglar_bench(
        ranks=args.ranks, size_mib=args.size_mib,
        straggler_delays_ms=_floats(args.straggler_delays),
        switching_delays_ms=_floats(args.delays), backends=_names(args.backends),
        iterations=args.iterations, plot=Path(args.plot),
        work_dir=Path(args.keep) if args.keep else None)


def _names(text: str | None) -> list[str] | None:
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def _add_collective_benches(bench: Any) -> None:
    """``bench alltoall`` and ``bench stragglar`` (collective algorithms on circuits)."""
    b = bench.add_parser(
        "alltoall", help="EP all-to-all: matchings vs multihop vs electrical against the "
        "switching delay, emulated (8 ranks) and simulated (8, 32, 256)",
        description="Mixtral-8x7B's EP dispatch (128 MiB per rank) on one rail, K = 2: "
        "1-factorization matchings, multihop over the lit ring, the electrical rail; time per "
        "all-to-all and the crossover delay. JSON on stdout, a plot in --plot.")
    b.add_argument("--ranks", default="8,32,256", help="simulated cluster sizes (sim-ideal)")
    b.add_argument("--emu-ranks", type=int, default=8,
                   help="cluster size of the emu and sim-emulator runs")
    b.add_argument("--size-mib", type=float, default=None,
                   help="bytes per rank (default: Mixtral-8x7B's EP dispatch, 128 MiB)")
    b.add_argument("--delays", default="0.01,1,10,25", help="switching delays in ms")
    _run_options(b, "bench-alltoall.png")
    b.set_defaults(bench_fn=_bench_alltoall)
    b = bench.add_parser(
        "stragglar", help="StragglAR vs Ring all-reduce with a persistent straggler on "
        "electrical rails and on circuits at 1 and 25 ms",
        description="An all-reduce over 8 ranks of one rail (K = 2), the last rank late by "
        "each straggler delay: StragglAR (arXiv 2505.23523) against the ring; speedups after "
        "the straggler's arrival and end to end. JSON on stdout, a plot in --plot.")
    b.add_argument("--ranks", type=int, default=8, help="cluster size (a power of two)")
    b.add_argument("--size-mib", type=float, default=1024.0, help="all-reduce buffer (MiB)")
    b.add_argument("--straggler-delays", default="0,10,20,50,100",
                   help="the straggler's delays in ms")
    b.add_argument("--delays", default="1,25", help="OCS switching delays in ms")
    _run_options(b, "bench-stragglar.png")
    b.set_defaults(bench_fn=_bench_stragglar)


def _run_options(b: argparse.ArgumentParser, plot: str) -> None:
    """Backends, iterations, plot file and kept runs of the collective benches."""
    b.add_argument("--backends", default=None,
                   help="comma-separated: emu (root), sim-ideal, sim-emulator; default: all as "
                   "root, the simulated ones otherwise")
    b.add_argument("--iterations", type=int, default=3, help="measured iterations per point")
    b.add_argument("--plot", default=plot, help="plot file (PNG)")
    b.add_argument("--keep", metavar="DIR", help="keep the emulated runs' results under DIR")


def _bench_failover(args: argparse.Namespace) -> dict[str, Any]:
    from pathlib import Path

    from testbed.emulated.bench import CONFIG, run_failover_bench

    return run_failover_bench(Path(args.config) if args.config else CONFIG,
                              tuple(_floats(args.delays)),
                              no_spares_delay_ms=None if args.no_spares_delay < 0
                              else args.no_spares_delay, backend=args.backend,
                              work_dir=Path(args.keep) if args.keep else None,
                              costs=args.costs)


def _bench_emulation(args: argparse.Namespace) -> dict[str, Any]:
    from pathlib import Path

    from testbed.studies.emulation_bench import SIZES, run_emulation_bench

    sizes = [int(x) for x in _floats(args.sizes)]
    unknown = [n for n in sizes if n not in SIZES]
    if unknown or not sizes:
        _refuse(f"opus-testbed: error: --sizes: no example of {unknown or 'no'} ranks; "
                f"choose from {', '.join(map(str, SIZES))}")
    return run_emulation_bench(sizes, time_dilation=args.time_dilation,
                               work_dir=Path(args.keep) if args.keep else None)


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _refuse(f"opus-testbed: error: expected comma-separated numbers, got {text!r}")


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run a benchmark and print it; exit 3 when a printed figure rests on a degraded run
    (the result's ``rests_on_degraded``: ``bench crossval``)."""
    from testbed.metrics.degraded import RESTS_ON, exit_status

    result = args.bench_fn(args)
    _print_bench(result, args.json)
    return exit_status(result.get(RESTS_ON) or [])


def _cmd_workload(args: argparse.Namespace) -> int:
    from workloads.cli import run

    return int(run(args))


def _version() -> str:
    """The installed distribution's version, else pyproject's (a source checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("opus-testbed")
    except PackageNotFoundError:
        return "0+unknown"


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it already names one (or has none
    worth showing)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default in (None, False, [], argparse.SUPPRESS)
                or action.option_strings == [] or isinstance(default, bool)):
            return text
        return f"{text} (default: %(default)s)"


class RawDefaultsHelpFormatter(DefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """:class:`DefaultsHelpFormatter` keeping the description's and epilog's line breaks."""


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every sub-parser below it a formatter that shows defaults (raw
    descriptions stay raw)."""
    current = parser.formatter_class
    raw = isinstance(current, type) and issubclass(current, argparse.RawDescriptionHelpFormatter)
    parser.formatter_class = RawDefaultsHelpFormatter if raw else DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _show_defaults(child)


def _add_basics(sub: Any) -> None:
    """``check`` and ``clean``."""
    p = sub.add_parser("check", help="report prerequisites (root, OVS, Mininet, os-ken, ...)",
                       description="Check every prerequisite; exit 1 if any is missing.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("clean", help="remove leftovers of crashed runs (this project's only)",
                       description="Remove processes (by recorded pid), OVS bridges and "
                       "interfaces (by the ot<xxx> name prefix) of runs whose owner is gone, "
                       "and restore ovs-vswitchd's scheduling policy once no live run holds "
                       "it.")
    p.add_argument("--all", action="store_true",
                   help="also remove runs whose owner process is still alive")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_clean)


def _add_bench(sub: Any) -> None:
    """``bench`` and its benchmarks, each with ``--json``."""
    p = sub.add_parser("bench", help="benchmarks, JSON on stdout",
                       description="Benchmarks; progress goes to stderr, results to stdout.")
    bench = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    _add_machine_benches(bench)
    _add_run_benches(bench)
    for b in bench.choices.values():
        b.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cmd_bench)


def _add_machine_benches(bench: Any) -> None:
    """Benchmarks of the emulator, the workload generator and the controller."""
    b = bench.add_parser("fidelity", help="data-plane dark period vs injected delay (root)")
    b.add_argument("--delays", default="1,5,25,100", help="injected delays in ms")
    b.add_argument("--switches", type=int, default=20, help="reconfigurations per delay")
    b.add_argument("--interval-us", type=float, default=100.0, help="probe interval")
    b.set_defaults(bench_fn=_bench_fidelity)
    b = bench.add_parser("control", help="OCS app overhead beyond the delay (root)")
    b.add_argument("--ports", default="8,16,64", help="rail sizes in ports")
    b.add_argument("--repeats", type=int, default=30, help="reconfigurations per point")
    b.set_defaults(bench_fn=_bench_control)
    b = bench.add_parser("counters", help="the switch's answer to a barrier, to every port's "
                         "counters and to single-port counters, as the OCS app's light asks them "
                         "(root)")
    b.add_argument("--ports", type=int, default=16, help="ports on the measured rail")
    b.add_argument("--repeats", type=int, default=300, help="round trips per case")
    b.set_defaults(bench_fn=_bench_counters)
    b = bench.add_parser("tcp", help="TCP between two ranks vs the link rate: one way, both "
                         "ways, a late second flow; the emulator's shaping against a FIFO per "
                         "link and the kernel's TCP queue cap (root)")
    b.add_argument("--link-mbps", type=float, default=8.0, help="shaped link rate")
    b.add_argument("--bytes", type=int, default=250_000, help="bytes per flow")
    b.add_argument("--trials", type=int, default=6, help="exchanges per case")
    b.add_argument("--late-ms", type=float, default=50.0,
                   help="how much later the second flow starts in the late case")
    b.set_defaults(bench_fn=_bench_tcp)
    b = bench.add_parser("workload", help="schedule generation for Llama3.1-405B on 16384 GPUs")
    b.set_defaults(bench_fn=_bench_workload)
    _add_controller_bench(bench)


def _add_run_benches(bench: Any) -> None:
    """Benchmarks made of experiment runs: cross-validation, failover, the simulator at
    scale and the collective algorithms."""
    b = bench.add_parser("crossval", help="one experiment emulated and simulated (root)",
                         description="Run CONFIG emulated and simulated from the same plan and "
                         "compare their mean iteration times (with --semantics/--delays, per "
                         "point against a 10 % bound). Exit status: 0, or 3 when an emulated "
                         "run is degraded (its figures are marked and listed under "
                         "rests_on_degraded); 1 a run failed, 2 bad input.")
    b.add_argument("config", help="experiment YAML that fits the emulator")
    b.add_argument("--keep", metavar="DIR", help="keep both runs' results under DIR")
    b.add_argument("--seeds", type=int, default=5,
                   help="simulation seeds; their measured iterations are pooled")
    b.add_argument("--semantics", help="comma-separated controller semantics (port-exact, "
                   "rail-state); with --delays, every point is compared (agreement per point)")
    b.add_argument("--delays", help="switching delays in ms, e.g. 0,100,250 (default: the "
                   "config's)")
    from testbed.cli.experiments import add_time_dilation
    from testbed.experiment.config import MODES

    b.add_argument("--mode", choices=MODES, help="override the config's mode")
    add_time_dilation(b)  # the simulated run's emulator costs are divided by the factor
    b.set_defaults(bench_fn=_bench_crossval)
    b = bench.add_parser("emulation", help="model rank-seconds emulated per wall second at 16, "
                         "32, 64 and 128 ranks, with the time dilation used (root)",
                         description="Run the example of each size (examples/demo.yaml, "
                         "emulator-32, emulator-64, emulator-128) on the emulator at the time "
                         "dilation auto picks (or --time-dilation) and report per size the "
                         "factor, model and wall seconds and the model rank-seconds emulated "
                         "per wall second, counted at fidelity ok only. Exit status: 0, or 3 "
                         "when a size's run is degraded.")
    b.add_argument("--sizes", default="16,32,64,128", help="comma-separated rank counts")
    b.add_argument("--keep", metavar="DIR", help="keep the runs' results under DIR")
    add_time_dilation(b)
    b.set_defaults(bench_fn=_bench_emulation)
    b = bench.add_parser("failover", help="spare-GPU failover: recovery time per switching "
                         "delay, against restarting every rank (emu: root)")
    b.add_argument("--delays", default="1,25,100", help="switching delays in ms")
    b.add_argument("--config", help="experiment with spares and faults (default "
                   "examples/failover-16.yaml: 16 ranks, one spare, five kills)")
    b.add_argument("--no-spares-delay", type=float, default=25.0,
                   help="the delay of the --no-spares comparison run (negative: skip it)")
    from testbed.experiment.backends import EMU, SELECTABLE

    b.add_argument("--backend", choices=SELECTABLE, default=EMU,
                   help="emu (root; the sim's prediction is reported beside it) or sim only")
    b.add_argument("--keep", metavar="DIR", help="keep the runs' results under DIR")
    from testbed.cli.experiments import add_costs

    add_costs(b)
    b.set_defaults(bench_fn=_bench_failover)
    b = bench.add_parser("ranks", help="two emulated runs' timing rank by rank (e.g. one "
                         "process per rank against one per server)",
                         description="Per rank of two finished emulated runs A and B: start "
                         "(loaded), first call, last iteration end (s after the rank processes' "
                         "launch) and every iteration's time, with B - A and the spread across "
                         "ranks of each run. Reads results only.")
    b.add_argument("a", help="results directory of run A")
    b.add_argument("b", help="results directory of run B")
    b.set_defaults(bench_fn=_bench_ranks)
    b = bench.add_parser("sim", help="simulation backend on Llama3.1-405B at 1024 and 16384 GPUs")
    b.add_argument("--gpus", default="1024,16384", help="cluster sizes, comma-separated")
    b.add_argument("--mode", default="provisioning",
                   choices=("baseline", "on-demand", "provisioning", "degree-aware"))
    b.add_argument("--delay", type=float, default=25.0, help="switching delay in ms")
    b.add_argument("--mirror", choices=("auto", "on", "off"), default="auto",
                   help="simulate one rank per stage and mirror the others (auto: large runs "
                   "of one rail)")
    b.add_argument("--rails", type=int, default=1,
                   help="simulate every rank of rails 0..N-1 (1..8; default 1: rail 0)")
    b.add_argument("--costs", choices=("fabric", "emulator"), default="fabric",
                   help="cost model: fabric (the modelled 400 Gbit/s rails, real bytes, the "
                   "controller's decision time) or emulator (the emulator's fixed costs at "
                   "a 1000 Mbit/s scaled link)")
    b.set_defaults(bench_fn=_bench_sim)
    _add_collective_benches(bench)


def _add_workload(sub: Any) -> None:
    """``workload``: a schedule from a model and its parallelism."""
    from testbed.cli.traces import COMPARE_HELP

    p = sub.add_parser("workload", help="generate a schedule from a model and its parallelism",
                       description="Generate one training iteration's per-rank schedule "
                       "(or replay a schedule file: workload: {schedule: FILE}).",
                       epilog=f"see also: {COMPARE_HELP}")
    from workloads.cli import add_arguments

    add_arguments(p)
    p.set_defaults(func=_cmd_workload)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opus-testbed",
        description="Hardware-in-the-loop emulation testbed for photonic rails (Opus): Mininet "
                    "hosts as GPU ranks, OVS bridges as optical circuit switches.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_basics(sub)
    from testbed.cli.compare import register as register_compare
    from testbed.cli.experiments import register as register_experiments
    from testbed.cli.export import register as register_export
    from testbed.cli.traces import register as register_traces
    from testbed.cost.cli import register as register_cost

    register_experiments(sub)
    register_traces(sub)
    register_cost(sub)
    register_export(sub)
    register_compare(sub)
    _add_ocs(sub)
    from testbed.cli.keys import register as add_keys

    add_keys(sub)
    _add_bench(sub)
    _add_workload(sub)
    _show_defaults(parser)
    return parser


def _add_controller_bench(bench: Any) -> None:
    """``bench intents``, when the controller package provides it."""
    try:
        from controller.bench import run_intents_bench
    except ImportError:
        return
    b = bench.add_parser("intents", help="Opus intent->ack latency and core throughput")
    fn: Callable[[argparse.Namespace], dict[str, Any]] = lambda _a: run_intents_bench()  # noqa: E731
    b.set_defaults(bench_fn=fn)


def _add_ocs(sub: Any) -> None:
    """``ocs`` (lab switches and the Polatis device simulator), when its module is present."""
    try:
        from testbed.cli.ocs import register
    except ImportError:
        return
    register(sub)


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if is_compare(words):  # `workload compare A B`, not `workload CONFIG`
        args = compare_parser().parse_args(words[2:])
    else:
        args = build_parser().parse_args(words)
    # SIGTERM (e.g. from `timeout` or CI) unwinds like Ctrl-C, so every teardown path runs.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    from testbed.errors import RankFailed, RunError, RunRefused
    from workloads.errors import WorkloadConfigError

    try:
        return int(args.func(args))
    except WorkloadConfigError as exc:  # bad experiment file or option: nothing was started
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RankFailed as exc:
        print(f"error: the run failed: {exc} (the network was torn down)", file=sys.stderr)
        return 1
    except RunRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # the emulated network could not be built (OVS not running...)
        network = sys.modules.get("emulator.network")
        if network is None or not isinstance(exc, network.EmulationError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the run's network and processes were torn down", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader left; say nothing more on stdout
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
