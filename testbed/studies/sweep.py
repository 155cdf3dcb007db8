"""``opus-testbed sweep``: iteration time against switching delay per mode (paper Fig. 8).

One experiment, run for every (semantics, mode, delay) point plus the electrical baseline once
(a delay of 0 ms in the list stands for the baseline and is not run in the OCS modes); the
overhead of each point is its iteration time against that baseline, measured in the same sweep.
Semantics (``port-exact``, ``rail-state``: :mod:`controller.railstate`) default to the config's.
Each point is a full run directory under ``OUT`` (``baseline/``, ``on-demand-25ms/``, ... or,
when the sweep runs rail-state, ``rail-state-on-demand-25ms/``, ...); the sweep directory gets
``sweep.csv`` (``mode, semantics, delay_ms, iteration_time_s, overhead_pct`` and extras),
``sweep.json`` (name, backend, points; per (semantics, mode) *family* the slope of step time
against delay over the points >= 250 ms and the overhead at 100 ms,
:func:`testbed.metrics.fit.fit_families`; the public artifact's figures,
:mod:`testbed.results.reference`, when the workload is the artifact's or asked for) and the
plot (:func:`testbed.results.store.render_sweep`).

Backends: emulated points run one after another (one emulated network at a time on a machine);
simulated points run in parallel, ``workers`` at a time, in a
:class:`concurrent.futures.ProcessPoolExecutor` (``engine="process"``). Optional engines for
simulated sweeps on a cluster: ``engine="ray"`` (``ray.remote`` tasks; ``ray.init()`` joins the
cluster named by ``RAY_ADDRESS`` or starts a local one) and ``engine="dask"``
(``dask.distributed``; a local cluster of ``workers`` processes, or the scheduler named by
``DASK_SCHEDULER_ADDRESS``). They are not dependencies of the testbed: without the package
the sweep stops with an error naming the pip extra.

A point that fails is recorded with its error and the sweep goes on; a failed baseline leaves
the overheads empty.

A point's figures rest on its own run and, for the overhead, on the baseline's: each row lists
the degraded ones under ``rests_on_degraded`` (``point`` labels; :mod:`testbed.metrics.degraded`),
each family lists those of its slope and its 100 ms overhead, and ``sweep.json`` lists every
degraded point; ``opus-testbed sweep`` marks those figures and exits 3.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from controller.railstate import PORT_EXACT, RAIL_STATE, SEMANTICS
from testbed.backends import EMU, SELECTABLE, SIM, UnknownBackend, get_backend, resolve
from testbed.errors import RunRefused, Say, say_stderr
from testbed.experiment.backends import PARALLEL_POINTS, emulated_static_refusal
from testbed.experiment.config import MODES, ExperimentConfig
from testbed.experiment.dilation import AUTO
from testbed.metrics.degraded import RESTS_ON, csv_cell, degraded_labels
from testbed.metrics.fit import fit_families
from testbed.results import store
from testbed.results.baseline import overhead_pct
from testbed.results.reference import artifact_reference, matches_artifact

BACKENDS = SELECTABLE  # the names of testbed.backends that a sweep takes
ENGINES = ("process", "ray", "dask")
Point = tuple[str, str, float]  # (semantics, mode, delay_ms); the baseline's semantics is ""
#: ``--planes`` (issue 40): a rival plane's points are ("", PLANE, delay_ms), a family each
RIVAL_PLANES = ("static", "rotor")
PLANES = ("opus", *RIVAL_PLANES)
COLUMNS = ("mode", "semantics", "delay_ms", "iteration_time_s", "overhead_pct",
           "exposed_reconfig_s",
           "reconfigurations_per_iteration", "all_iterations_completed", "fidelity",
           "fidelity_blame", "backend", "wall_s", "run_dir", "error", "point",
           "fidelity_reasons", RESTS_ON)
#: Columns whose JSON value is a list of strings, one ``"; "``-joined cell in ``sweep.csv``.
LIST_COLUMNS = ("fidelity_reasons", RESTS_ON)
EXTRAS = {"ray": "ray", "dask": "dask"}  # engine -> pip extra of opus-testbed


class SweepError(ValueError):
    """A sweep that cannot start (bad option, missing engine); nothing was run."""


def _quiet(_msg: str) -> None:
    pass


def sweep_points(modes: Sequence[str], delays_ms: Sequence[float],
                 semantics: Sequence[str] = (PORT_EXACT,),
                 planes: Sequence[str] = ("opus",)) -> list[Point]:
    """(semantics, mode, delay_ms) of every run: the baseline once at 0 (semantics ""), then
    per semantics each mode at each delay > 0 (if ``planes`` has ``opus``), then each rival
    plane of ``planes`` at each delay > 0 (its mode column is the plane's name)."""
    bad = [p for p in planes if p not in PLANES]
    if bad or not planes:
        raise SweepError(f"unknown planes {bad}; choose from {', '.join(PLANES)}")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SweepError(f"unknown modes {bad}; choose from {', '.join(MODES)}")
    bad = [s for s in semantics if s not in SEMANTICS]
    if bad or not semantics:
        raise SweepError(f"unknown semantics {bad}; choose from {', '.join(SEMANTICS)}")
    if RAIL_STATE in semantics and "degree-aware" in modes:
        raise SweepError("degree-aware is a port-exact assignment policy: drop it from --modes "
                         "or rail-state from --semantics")
    if any(d < 0 for d in delays_ms):
        raise SweepError(f"switching delays must be >= 0 ms, got {list(delays_ms)}")
    points: list[Point] = [("", "baseline", 0.0)]
    for sem in dict.fromkeys(semantics):
        for mode in dict.fromkeys(modes):
            if mode != "baseline":  # a delay of 0 ms is the baseline's point
                points += [(sem, mode, float(d)) for d in dict.fromkeys(delays_ms) if d > 0]
    if "opus" not in planes:
        points = points[:1]
    for plane in dict.fromkeys(p for p in planes if p in RIVAL_PLANES):
        points += [("", plane, float(d)) for d in dict.fromkeys(delays_ms) if d > 0]
    return points


def point_dir(out: Path, point: Point, tagged: bool = False) -> Path:
    """``baseline``, ``MODE-Dms``, or with ``tagged`` (a sweep that runs rail-state)
    ``SEMANTICS-MODE-Dms``."""
    semantics, mode, delay_ms = point
    if mode == "baseline":
        return out / "baseline"
    return out / (f"{semantics}-" * (tagged and bool(semantics)) + f"{mode}-{delay_ms:g}ms")


def _point_config(cfg: ExperimentConfig, point: Point) -> ExperimentConfig:
    semantics, mode, delay_ms = point
    if mode == "baseline":
        return cfg.replace(mode=mode)
    if mode in RIVAL_PLANES:  # (the file's mode means nothing to them, unless it is baseline)
        return cfg.replace(control_plane=mode, switching_delay=float(delay_ms),
                           mode="on-demand" if cfg.mode == "baseline" else cfg.mode)
    return cfg.replace(mode=mode, switching_delay=float(delay_ms), semantics=semantics)


def run_sim_point(cfg: ExperimentConfig, point: Point, run_dir: str) -> dict[str, Any]:
    """One simulated point (in a worker process); returns its summary or its error."""
    t0 = time.monotonic()
    sim = get_backend(SIM)
    try:
        point_cfg = _point_config(cfg, point)
        return sim.run(point_cfg, Path(run_dir), _quiet, sim.check(point_cfg))
    except Exception as exc:  # reported in the sweep's row, the other points go on
        return {"error": f"{type(exc).__name__}: {exc}", "wall_s": time.monotonic() - t0,
                "trace": traceback.format_exc(limit=3)}


def _run_emu_point(cfg: ExperimentConfig, point: Point, run_dir: Path, say: Say
                   ) -> dict[str, Any]:
    from testbed.errors import RunError

    t0 = time.monotonic()
    emu = get_backend(EMU)
    try:
        point_cfg = _point_config(cfg, point)
        return emu.run(point_cfg, run_dir, say, emu.check(point_cfg))
    except RunError as exc:
        return {"error": str(exc), "wall_s": time.monotonic() - t0}


def sweep_dilation(cfg: ExperimentConfig, points: Sequence[Point], say: Say
                   ) -> ExperimentConfig:
    """``cfg`` with ``auto`` time dilation resolved once for the whole emulated sweep: the
    largest factor any of its points gets alone, so that every point and the baseline they are
    set against run at one factor (their per-call costs alike in model time)."""
    if cfg.time_dilation != AUTO:
        return cfg
    from testbed.errors import RunError
    from testbed.experiment.prepare import prepare
    from testbed.studies.predict import fabric_overhead

    picks: list[tuple[float, str]] = []
    for p in points:
        try:
            prep = prepare(_point_config(cfg, p), predict_overhead=fabric_overhead)
        except RunError:
            continue  # the point refuses when it runs, with its reason
        if prep.dilation is not None:
            picks.append((prep.time_dilation, f"{point_label(p)}: {prep.dilation.text()}"))
    if not picks:
        return cfg
    k, why = max(picks, key=lambda kv: kv[0])
    say(f"time dilation {k:g} for every point (the largest auto picks; {why})")
    return cfg.replace(time_dilation=k)


def check_points(cfg: ExperimentConfig, points: Sequence[Point], backend: str) -> None:
    """Every job check of the sweep before any point runs (:func:`~testbed.studies.run.
    check_one`): one point per mode and semantics (the delay changes no check), so a job the
    rails cannot carry is refused (exit 2), not reported as failed points after the baseline
    ran."""
    from testbed.studies.run import check_one

    seen: set[tuple[str, str]] = set()
    for point in points:
        semantics, mode, _delay = point
        if (semantics, mode) not in seen:
            seen.add((semantics, mode))
            check_one(_point_config(cfg, point), backend)


def check_planes(cfg: ExperimentConfig, points: Sequence[Point], backend: str) -> None:
    """:class:`SweepError`, before any point runs, for a rival plane of ``points`` that
    ``backend`` refuses, with its reason: through the registry (the rotor, and
    ``controller.relay_paths: dynamic``, on the emulator) and, on the emulator, the static
    plane's own limits (one port per rank, no spares or faults). The emulator runs ``static``
    as ``run`` does."""
    first: dict[str, Point] = {}  # a plane's first point: its delay changes no check
    for p in points:
        if p[1] in RIVAL_PLANES:
            first.setdefault(p[1], p)
    for point in first.values():
        point_cfg = _point_config(cfg, point)
        try:
            chosen = resolve(point_cfg, backend)
        except RunRefused as exc:
            raise SweepError(f"--planes {point[1]}: {exc}") from exc
        if chosen.name == EMU:
            shape = point_cfg.shape
            why = emulated_static_refusal(point_cfg.effective_ports_per_rank,
                                          bool(shape.spares_per_server or shape.spare_servers),
                                          bool(point_cfg.faults))
            if why is not None:
                raise SweepError(f"--planes {point[1]}: {point_cfg.source}: {why}")


def point_label(point: Point) -> str:
    """``baseline`` or ``[SEMANTICS ]MODE D ms``: how rows, legends and
    ``rests_on_degraded`` name a point."""
    semantics, mode, delay_ms = point
    if mode == "baseline":
        return "baseline"
    return f"{semantics + ' ' if semantics else ''}{mode} {delay_ms:g} ms"


def _map_sim(cfg: ExperimentConfig, points: list[Point], dirs: list[Path], workers: int,
             engine: str, say: Say) -> list[dict[str, Any]]:
    args = [(cfg, p, str(d)) for p, d in zip(points, dirs, strict=True)]
    if engine == "process":
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(run_sim_point, *a) for a in args]
            summaries = []
            for p, fut in zip(points, futures, strict=True):
                summaries.append(fut.result())
                say(f"  {point_label(p)}: {_brief(summaries[-1])}")
            return summaries
    if engine == "ray":
        try:
            import ray
        except ImportError as exc:
            raise SweepError("--engine ray needs Ray: pip install 'opus-testbed[ray]'") from exc
        ray.init(ignore_reinit_error=True, **({} if os.environ.get("RAY_ADDRESS")
                                              else {"num_cpus": workers}))
        task = ray.remote(num_cpus=1)(run_sim_point)
        return list(ray.get([task.remote(*a) for a in args]))
    if engine == "dask":
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError as exc:
            raise SweepError("--engine dask needs dask.distributed: pip install "
                             "'opus-testbed[dask]'") from exc
        address = os.environ.get("DASK_SCHEDULER_ADDRESS")
        if address:
            with Client(address) as client:
                return list(client.gather(client.map(run_sim_point, *zip(*args, strict=True),
                                                     pure=False)))
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True) as cluster, \
                Client(cluster) as client:
            return list(client.gather(client.map(run_sim_point, *zip(*args, strict=True),
                                                 pure=False)))
    raise SweepError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")


def _brief(summary: dict[str, Any]) -> str:
    if summary.get("error"):
        return f"failed: {summary['error']}"
    t = summary.get("iteration_time_s")
    return f"{t:.3f} s per iteration" if t is not None else "no measured iteration"


def run_sweep(cfg: ExperimentConfig, delays_ms: list[float], modes: list[str], out: Path,
              backend: str, workers: int, say: Say = say_stderr, *,
              engine: str = "process", semantics: Sequence[str] | None = None,
              reference: bool = False, planes: Sequence[str] = ("opus",)
              ) -> list[dict[str, Any]]:
    """Run every point, write ``sweep.csv``, ``sweep.json`` and the plot; returns the rows.
    ``semantics`` defaults to the config's. The artifact's points go into ``sweep.json`` (and
    the plot) when the workload is the artifact's or ``reference`` asks for them."""
    try:
        chosen = resolve(cfg, backend)
    except UnknownBackend as exc:
        raise SweepError(str(exc)) from exc
    if engine not in ENGINES:
        raise SweepError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    if engine != "process" and not chosen.spec.supports(PARALLEL_POINTS):
        raise SweepError(str(chosen.spec.refusal(PARALLEL_POINTS)))
    if workers < 1:
        raise SweepError(f"workers must be >= 1, got {workers}")
    semantics = list(dict.fromkeys([cfg.semantics] if semantics is None else semantics))
    points = sweep_points(modes, delays_ms, semantics, planes)
    check_planes(cfg, points, backend)
    for point in points:  # refused combinations stop the sweep before anything runs
        _point_config(cfg, point)
    check_points(cfg, points, backend)
    if out.exists() and any(out.iterdir()):
        raise SweepError(f"{out} exists and is not empty; choose another --out (nothing was "
                         "changed)")
    dirs = [point_dir(out, p, tagged=RAIL_STATE in semantics) for p in points]
    out.mkdir(parents=True, exist_ok=True)
    ocs_delays = [d for d in dict.fromkeys(delays_ms) if d > 0]
    ocs_modes = list(dict.fromkeys(p[1] for p in points if p[0]))  # Opus's, with semantics
    rivals = list(dict.fromkeys(p[1] for p in points if p[1] in RIVAL_PLANES))
    at = f" at {', '.join(f'{d:g}' for d in ocs_delays)} ms"
    what = (f"; {', '.join(ocs_modes)} ({', '.join(semantics)}){at}" if ocs_modes and ocs_delays
            else "") + (f"; planes {', '.join(rivals)}{at}" if rivals and ocs_delays else "")
    costs = cfg.sim_costs if chosen.name == SIM else None
    how = f"{backend}, costs {costs}" if costs else backend
    say(f"sweep {cfg.name} ({how}): {len(points)} points (the electrical baseline, which "
        f"stands for 0 ms{what}); results in {out}")
    t0 = time.monotonic()
    if chosen.name == SIM:  # points side by side, in worker processes
        summaries = _map_sim(cfg, points, dirs, workers, engine, say)
    else:
        cfg = sweep_dilation(cfg, points, say)
        summaries = []
        for p, run_dir in zip(points, dirs, strict=True):
            say(f"point {point_label(p)}")
            summaries.append(_run_emu_point(cfg, p, run_dir, say))
            say(f"  {point_label(p)}: {_brief(summaries[-1])}")
        judge_overheads(points, summaries, dirs)
    adopt_windows(points, summaries, dirs)
    rows = sweep_rows(points, summaries, dirs, backend)
    matches = matches_artifact(cfg.workload)
    calibration = sweep_calibration(cfg, points, summaries)
    if calibration and calibration["far"]:
        say(f"note: the measured baseline ({calibration['baseline_iteration_time_s']:.3f} s) is "
            f"{calibration['gap_pct']:+.1f} % off the calibration target "
            f"({calibration['calibrate_step_s']:g} s)")
    store.write_csv(out / "sweep.csv", csv_rows(rows))
    store.write_json(out / "sweep.json", {
        "name": cfg.name, "backend": backend, "costs": costs, "engine": engine,
        "modes": list(modes), "planes": list(planes),
        "semantics": semantics, "delays_ms": list(delays_ms), "config": cfg.to_json(),
        "calibration": calibration, "wall_s": time.monotonic() - t0,
        "families": fit_families(rows), "reference_matches": matches,
        "reference": artifact_reference() if matches or reference else None,
        RESTS_ON: degraded_labels((r["point"], r) for r in rows), "points": rows})
    store.render_sweep(out)
    return rows


def sweep_calibration(cfg: ExperimentConfig, points: Sequence[Point],
                      summaries: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """``sweep.json``'s ``calibration``: the target, the compute scale, the modelled step and
    the measured baseline against the target (None when the workload is not calibrated)."""
    target = cfg.workload.calibrate_step_s
    if target is None:
        return None
    from testbed.results.summary import CALIBRATION_GAP_PCT, calibration_gap_pct

    modeled = next((s["modeled_iteration_s"] for s in summaries
                    if s.get("modeled_iteration_s") is not None), None)
    base = next((s.get("iteration_time_s") for (_, mode, _), s
                 in zip(points, summaries, strict=True) if mode == "baseline"), None)
    gap = None if base is None else calibration_gap_pct(base, target)
    return {"calibrate_step_s": target, "compute_scale": cfg.workload.compute_scale,
            "modeled_iteration_s": modeled, "baseline_iteration_time_s": base, "gap_pct": gap,
            "far": gap is not None and abs(gap) > CALIBRATION_GAP_PCT}


def adopt_windows(points: Sequence[Point], summaries: Sequence[dict[str, Any]],
                  dirs: Sequence[Path]) -> None:
    """Give every switched point the windows of the sweep's baseline, as ``run --baseline``
    does (:func:`~testbed.results.baseline.adopt_baseline_windows`), on disk too."""
    from testbed.results.baseline import adopt_baseline_windows

    base = next((d for (_, m, _), d in zip(points, dirs, strict=True) if m == "baseline"), None)
    if base is None:
        return
    for (_, mode, _), s, run_dir in zip(points, summaries, dirs, strict=True):
        if mode != "baseline" and (run_dir / "summary.json").exists() and "error" not in s:
            store.write_json(run_dir / "summary.json", adopt_baseline_windows(run_dir, base, s))


def judge_overheads(points: Sequence[Point], summaries: Sequence[dict[str, Any]],
                    dirs: Sequence[Path]) -> None:
    """Judge each emulated point's overhead against the sweep's baseline as ``run --baseline``
    judges it (the bound late light puts on the overhead itself), in its ``summary.json`` too,
    so that a point is degraded the same way whichever command measured it."""
    from testbed.results.summary import judge_against_baseline

    base = next((s.get("iteration_time_s") for (_, m, _), s
                 in zip(points, summaries, strict=True) if m == "baseline"), None)
    if base is None:
        return
    for (_, mode, _), s, run_dir in zip(points, summaries, dirs, strict=True):
        if mode == "baseline" or s.get("iteration_time_s") is None:
            continue
        before = s.get("fidelity_causes")
        s["baseline_iteration_time_s"] = base
        judge_against_baseline(s)
        if s.get("fidelity_causes") != before and (run_dir / "summary.json").exists():
            store.write_json(run_dir / "summary.json", s)


def sweep_rows(points: Sequence[Point], summaries: Sequence[dict[str, Any]],
               dirs: Sequence[Path], backend: str) -> list[dict[str, Any]]:
    """One row per point; overheads against the baseline point of the same sweep. A row's
    ``rests_on_degraded`` names its own run if degraded and, when it has an overhead, the
    baseline if degraded."""
    baseline = next((s for (_, m, _), s in zip(points, summaries, strict=True)
                     if m == "baseline"), {})
    base = baseline.get("iteration_time_s")
    rows = []
    for point, s, run_dir in zip(points, summaries, dirs, strict=True):
        semantics, mode, delay = point
        t = s.get("iteration_time_s")
        overhead = overhead_pct(t, base)
        label = point_label(point)
        rests_on = degraded_labels([(label, s)] + [("baseline", baseline)] * (
            overhead is not None))
        rows.append({
            "mode": mode, "semantics": semantics, "delay_ms": delay, "iteration_time_s": t,
            "overhead_pct": overhead,
            "exposed_reconfig_s": s.get("exposed_reconfig_s"),
            "reconfigurations_per_iteration": s.get("reconfigurations_per_iteration"),
            "all_iterations_completed": s.get("all_iterations_completed"),
            "fidelity": s.get("fidelity"), "fidelity_blame": s.get("fidelity_blame"),
            "backend": backend, "wall_s": s.get("wall_s"),
            "run_dir": str(run_dir), "error": s.get("error", ""), "point": label,
            "fidelity_reasons": list(s.get("fidelity_reasons") or []), RESTS_ON: rests_on})
    return [{k: r[k] for k in COLUMNS} for r in rows]


def csv_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` as ``sweep.csv`` holds them: list columns as one ``"; "``-joined cell."""
    return [{k: csv_cell(v) if k in LIST_COLUMNS else v for k, v in r.items()} for r in rows]
