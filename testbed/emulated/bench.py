"""``opus-testbed bench failover``: how fast a spare GPU takes a failed rank over, per switching
delay, against restarting every rank (``--no-spares``).

The run is ``examples/failover-16.yaml``: 16 ranks on one rail OCS, one spare server, a rank
killed every three iterations; the failed host is repaired and rejoins the pool, so one spare
serves all five failures of a run. For each switching delay (default 1, 25 and 100 ms) it runs
the experiment on the emulator and reports, over the run's failovers, ``recovery_s`` (failure to
the first collective completed with the spare) at p50 and p99, how it splits into detection,
rewiring and restart (each component's share of the summed recovery time), the heartbeat-only
detection time, the iteration time before and after, whether every byte after the resumptions
arrived, the fidelity verdict, and the sim backend's prediction for the same run (under the
``emulator`` cost model, a cross-validation of the emulated run, unless ``--costs`` names one;
``--backend sim`` alone runs the file's ``sim.costs``, ``fabric`` by default). The target
is p50 <= 1 s + the switching delay; LUMION (arXiv 2505.23105) restarts a job about 1 s after
a GPU fails by splicing a spare into its rack-scale optical fabric. At one delay the same run
with ``--no-spares`` (the first two failures) shows the alternative: every rank restarts from
the last completed iteration, which is what a job moved to a new rack must at least pay.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from controller import stats
from testbed.backends import EMU, SIM, resolve
from testbed.errors import RunError, Say, say_stderr
from testbed.experiment.config import EMULATOR, ExperimentConfig, load_experiment

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "failover-16.yaml"
LUMION_RECOVERY_S = 1.0


def percentile(values: list[float], p: float) -> float | None:
    """:func:`controller.stats.percentile` (``p`` in 0..100); None for no values."""
    return stats.percentile(values, p) if values else None


def recovery_figures(summary: dict[str, Any], delay_ms: float) -> dict[str, Any]:
    """The benchmark's row for one run's summary."""
    rows = [r for r in summary.get("recovery", [])
            if r["policy"] != "in_place" and r["recovery_s"] is not None]
    rec = [float(r["recovery_s"]) for r in rows]
    total = sum(rec)

    def share(key: str) -> float | None:
        return sum(float(r[key]) for r in rows) / total if total > 0 else None

    p50 = percentile(rec, 50)
    return {
        "delay_ms": delay_ms, "recoveries": len(rows),
        "failovers": summary.get("failovers"), "restarts": summary.get("restarts"),
        "resumes_in_place": summary.get("resumes_in_place"),
        "recovery_p50_s": p50, "recovery_p99_s": percentile(rec, 99),
        "recovery_s": rec,
        "detection_p50_s": percentile([float(r["detection_s"]) for r in rows], 50),
        "rewiring_p50_s": percentile([float(r["rewiring_s"]) for r in rows], 50),
        "restart_p50_s": percentile([float(r["restart_s"]) for r in rows], 50),
        "detection_share": share("detection_s"), "rewiring_share": share("rewiring_s"),
        "restart_share": share("restart_s"),
        "heartbeat_detection_p50_s": percentile(
            [float(r["heartbeat_s"]) for r in rows if r["heartbeat_s"] is not None], 50),
        "iteration_time_before_s": summary.get("iteration_time_before_s"),
        "iteration_time_after_s": summary.get("iteration_time_after_s"),
        "after_resume_delivered": summary.get("after_resume_delivered"),
        "all_iterations_completed": summary.get("all_iterations_completed"),
        "target_s": 1.0 + delay_ms / 1e3,
        "meets_target": p50 is not None and p50 <= 1.0 + delay_ms / 1e3,
        "fidelity": summary.get("fidelity"), "fidelity_reasons": summary.get("fidelity_reasons"),
    }


def _run(cfg: ExperimentConfig, out: Path, backend: str, say: Say) -> dict[str, Any]:
    """One run on ``backend`` (the sim's under the file's cost model, ``sim.costs``)."""
    chosen = resolve(cfg, backend)
    return chosen.run(cfg, out, say, chosen.check(cfg))


def run_failover_bench(config: Path = CONFIG, delays_ms: tuple[float, ...] = (1.0, 25.0, 100.0),
                       *, no_spares_delay_ms: float | None = 25.0, backend: str = EMU,
                       work_dir: Path | None = None, say: Say = say_stderr,
                       costs: str | None = None) -> dict[str, Any]:
    """Run the benchmark (see the module docstring); returns the JSON-ready result.
    ``costs`` overrides the file's ``sim.costs`` (the simulated runs' cost model; beside
    emulated runs the prediction is the ``emulator`` model's unless ``costs`` is given)."""
    cfg = load_experiment(config)
    if costs is not None:
        cfg = cfg.replace(sim_costs=costs)
    beside_sim = resolve(cfg, backend).name != SIM  # refuses an unknown backend up front
    own = work_dir is None
    root = Path(tempfile.mkdtemp(prefix="opus-bench-failover-")) if work_dir is None else work_dir
    t0 = time.monotonic()
    results = []
    try:
        for delay in delays_ms:
            point = cfg.replace(switching_delay=delay)
            say(f"bench failover: {backend}, switching delay {delay:g} ms")
            try:
                summary = _run(point, root / f"{backend}-{delay:g}ms", backend, say)
                row = recovery_figures(summary, delay)
            except RunError as exc:
                row = {"delay_ms": delay, "error": str(exc)}
            if beside_sim:  # beside an emulated run: the emulator's costs by default
                predict = point if costs is not None else point.replace(sim_costs=EMULATOR)
                row["sim_costs"] = predict.sim_costs
                try:
                    sim = _run(predict, root / f"sim-{delay:g}ms", SIM, lambda _m: None)
                    row["sim_recovery_p50_s"] = recovery_figures(sim, delay)["recovery_p50_s"]
                except RunError as exc:
                    row["sim_recovery_p50_s"], row["sim_error"] = None, str(exc)
            results.append(row)
        no_spares = None
        if no_spares_delay_ms is not None:
            point = cfg.replace(switching_delay=no_spares_delay_ms, no_spares=True,
                                faults=cfg.faults[:2])
            say(f"bench failover: {backend}, --no-spares at {no_spares_delay_ms:g} ms")
            try:
                no_spares = recovery_figures(_run(point, root / f"{backend}-no-spares", backend,
                                                  say), no_spares_delay_ms)
            except RunError as exc:
                no_spares = {"delay_ms": no_spares_delay_ms, "error": str(exc)}
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    return {"bench": "failover", "backend": backend, "config": str(config),
            "world_size": cfg.workload.cluster.world_size, "spares": len(cfg.shape.spares),
            "faults": len(cfg.faults), "lumion_recovery_s": LUMION_RECOVERY_S,
            "target": "recovery p50 <= 1 s + switching delay",
            "results": results, "no_spares": no_spares,
            "results_dir": None if own else str(root),
            "wall_s": time.monotonic() - t0}
