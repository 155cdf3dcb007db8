"""``opus-testbed sweep``: iteration time against switching delay for each mode (paper Fig. 8).

The baseline (electrical rails) runs once; every other mode runs at every delay, and its
overhead is against the baseline measured in the same sweep. Emulated points run one after
another (one emulated network at a time on a machine); simulated points run in a process pool.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from testbed import results
from testbed.experiment import ExperimentConfig

Point = tuple[str, float]


def _run_point(cfg: ExperimentConfig, mode: str, delay_ms: float, out: Path,
               backend: str) -> dict[str, Any]:
    from testbed.experiment_cli import run_one

    point = cfg.replace(mode=mode, switching_delay=delay_ms)
    return run_one(point, out, backend, lambda _m: None)


def _point_dir(out: Path, mode: str, delay_ms: float) -> Path:
    return out / (mode if mode == "baseline" else f"{mode}-{delay_ms:g}ms")


def run_sweep(cfg: ExperimentConfig, delays_ms: list[float], modes: list[str], out: Path,
              backend: str, workers: int, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Run the grid, write ``sweep.csv``/``sweep.json`` and the plot; returns the rows."""
    points: list[Point] = [("baseline", 0.0)]
    points += [(m, d) for m in modes if m != "baseline" for d in delays_ms if d > 0]
    out.mkdir(parents=True, exist_ok=True)
    summaries: dict[Point, dict[str, Any]] = {}
    if backend == "sim" and workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {p: pool.submit(_run_point, cfg, p[0], p[1], _point_dir(out, *p),
                                      backend) for p in points}
            for p, fut in futures.items():
                summaries[p] = fut.result()
                say(f"  {p[0]} {p[1]:g} ms: {summaries[p]['iteration_time_s']:.3f} s")
    else:
        for i, p in enumerate(points, 1):
            say(f"point {i}/{len(points)}: {p[0]} at {p[1]:g} ms")
            summaries[p] = _run_point(cfg, p[0], p[1], _point_dir(out, *p), backend)
    base = summaries[("baseline", 0.0)]["iteration_time_s"]
    rows = []
    for p in points:
        s = summaries[p]
        it = s.get("iteration_time_s")
        rows.append({"mode": p[0], "delay_ms": p[1], "iteration_time_s": it,
                     "overhead_pct": (100.0 * (it - base) / base) if it and base else None,
                     "reconfigurations_per_iteration": s.get("reconfigurations_per_iteration"),
                     "exposed_reconfig_s": s.get("exposed_reconfig_s"),
                     "fidelity": s.get("fidelity"),
                     "run_dir": str(_point_dir(out, *p).name)})
    results.write_csv(out / "sweep.csv", rows)
    results.write_json(out / "sweep.json", {"name": cfg.name, "backend": backend,
                                            "delays_ms": delays_ms, "modes": modes,
                                            "points": rows})
    results.render_sweep(out)
    return rows
