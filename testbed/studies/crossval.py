"""``opus-testbed bench crossval``: one experiment on both backends, iteration times compared.

Runs the config emulated (Mininet, Open vSwitch, real TCP, the Opus service; needs root) and
simulated (:mod:`testbed.simulator.engine`) under the ``emulator`` cost model (its measured
fixed costs at its scaled link, never the default ``fabric``; ``sim_costs`` in the JSON) from
the same prepared plan,
each into its own results directory under a temporary (or given) directory, and compares the
mean measured iteration time. ``ratio`` is simulated over emulated. Races decide some
iterations (two lanes of a rank asking at once: whichever intent reaches the controller first
keeps its circuit), so iteration times are multimodal (0.9-1.5 s for the CI test's config
with one port per rank): the mean weighs the outcomes by how often they happen, where a
median of five iterations jumps between modes (medians put ratios of 1.00-1.24 on runs whose
means gave 0.95-1.13).
The simulated side pools the measured iterations of ``sim_seeds`` seeds of the
control-latency draws; the results directory ``sim/`` is the first seed's run.
:func:`run_crossval_points` does this for several semantics and switching delays
(``bench crossval --semantics port-exact,rail-state --delays 0,100,250``) and reports, per
point, the agreement ``|emu - sim| / sim`` against a 10 % bound: a benchmark (JSON), not a test.
Every comparison rests on its emulated run: a degraded one is listed under
``rests_on_degraded`` (with its reasons under ``degraded_runs``, and the figures it touches
under ``degraded_figures``; :mod:`testbed.metrics.degraded`), and ``bench crossval`` exits 3.

It also measures, from the emulated run's records and event log, the constants the sim backend
uses for the emulator (:data:`testbed.simulator.network.EMULATOR_COSTS`), so that a machine whose
emulator is faster or slower can be modelled (:func:`measure_costs`):

* ``control_s``: median of intent -> core, ack -> rank and completion -> core;
* ``switch_overhead_s``: median of decision -> end of reconfiguration, minus the delay, for
  decisions that did not wait for an earlier one on their rail;
* ``goodput``, ``step_s``, ``connect_finish_s``: a least-squares fit of the median call
  duration (ack to end) of each call shape in the measured iterations to ``a + step_s * steps
  with receptions + connect_finish_s * peers + bytes * 8 / (goodput * link rate)``; rough
  (a handful of shapes, a loaded machine), but it shows when the model's constants are off.

The defaults of ``EMULATOR_COSTS`` come from this benchmark on the development machine (4 ranks,
userspace Open vSwitch, 2 cores): one way between a rank and the controller p10 0.4 ms, median
0.9-1.3 ms, p90 2-3.6 ms; connect + finish ~2 ms per call and peer, a step ~1 ms; a switching
overhead of ~4.5 ms at 25 ms; goodput fits of 0.72-0.91 per call shape (medians ~0.90, means
lower: the default is 0.85). With 16 ranks on the 2 cores the costs were about twice as large.
Those 4-rank runs came with the config of ``tests/emulation/test_crossval.py``'s calibration
check; ``examples/llama3-8b-artifact-scaled.yaml`` came after and is the held-out config that
the same file's validation test holds to :data:`AGREEMENT_BOUND`.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from testbed.errors import Say, say_stderr
from testbed.experiment.config import load_experiment
from testbed.metrics.degraded import RESTS_ON, degraded_labels, degraded_runs, union
from testbed.plan.rankplan import plan_record
from testbed.plan.replay import PlanOp
from testbed.results import store

#: The emulator and the simulator agree on a point when |emu - sim| / sim is at most this.
AGREEMENT_BOUND = 0.10
#: The figures of :func:`run_crossval` that rest on both runs (hence on a degraded one).
FIGURES = ("emu_iteration_s", "sim_iteration_s", "ratio")
#: The figures of :func:`run_crossval_points` that rest on every point's runs.
POINTS_FIGURES = ("all_within_bound", "worst_agreement_pct")


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def measure_costs(run_dir: Path) -> dict[str, float | None]:
    """Emulator constants measured from an emulated run directory (see the module docstring)."""
    manifest = _read_json(run_dir / "manifest.json")
    link_bps = float(manifest["link_mbps"]) * 1e6
    delay_s = float(manifest["config"].get("switching_delay_ms", 0.0)) / 1e3
    warmup = int(manifest["config"].get("warmup", 0))
    records = [r for p in sorted((run_dir / "ranks").glob("rank*.jsonl"))
               for r in store.read_jsonl(p)]
    events = store.read_jsonl(run_dir / "controller-events.jsonl")
    intent, ack, done = {}, {}, {}
    for e in events:
        key = (e.get("rank"), e.get("group"), e.get("seq"))
        if e["event"] == "intent":
            intent[key] = float(e["t_s"])
        elif e["event"] == "ack":
            ack[key] = float(e["t_s"])
        elif e["event"] == "complete":
            done[key] = float(e["t_s"])
    control = []
    for r in records:
        if r.get("ev") != "call":
            continue
        key = (r["rank"], r["lane"], r["seq"])
        if key in intent:
            control.append(intent[key] - float(r["t_intent"]))
        if key in ack:
            control.append(float(r["t_ack"]) - ack[key])
        if key in done:
            control.append(done[key] - float(r["t_end"]))
    decided = {e["decision"]: float(e["t_s"]) for e in events if e["event"] == "decision"}
    switch = [float(e["t_s"]) - decided[e["decision"]] - delay_s for e in events
              if e["event"] == "reconfig_end" and e["decision"] in decided
              and float(e["t_request_s"]) - decided[e["decision"]] < 0.5 * max(delay_s, 1e-3)]
    out: dict[str, float | None] = {"control_s": _median(control),
                                    "switch_overhead_s": _median(switch) if delay_s else None}
    out.update(_fit_calls(run_dir, records, link_bps, warmup))
    return out


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def _fit_calls(run_dir: Path, records: Sequence[Mapping[str, Any]], link_bps: float,
               warmup: int) -> dict[str, float | None]:
    plans: dict[int, dict[int, PlanOp]] = {}
    for p in (run_dir / "ranks").glob("rank*.plan.json"):
        plan = plan_record(_read_json(p), str(p))
        if plan is not None:
            plans[plan.rank] = {o.index: o for o in plan.ops}
    shapes: dict[tuple[int, int, int], list[float]] = {}
    for r in records:
        if r.get("ev") != "call" or int(r["it"]) < warmup:
            continue
        op = plans.get(int(r["rank"]), {}).get(int(r["i"]))
        if op is None:
            continue
        with_recv = sum(1 for step in op.steps if step.recvs)
        peers = len({p for step in op.steps for p, _n in step.sends})
        moved = max(int(r["sent"]), int(r["expected"]))
        shapes.setdefault((with_recv, peers, moved), []).append(
            float(r["t_end"]) - float(r["t_ack"]))
    if len(shapes) < 4:
        return {"goodput": None, "step_s": None, "connect_finish_s": None}
    # one row per call shape, its median duration: robust to the stalls of a loaded machine
    x = np.array([[1.0, w, p, n * 8 / link_bps] for w, p, n in shapes])
    y = np.array([statistics.median(v) for v in shapes.values()])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return {"goodput": float(1 / coef[3]) if coef[3] > 0 else None,
            "step_s": float(coef[1]), "connect_finish_s": float(coef[2])}


def run_crossval(config_path: str | Path, *, work_dir: Path | None = None,
                 say: Say = say_stderr, sim_seeds: int = 5,
                 overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"emu_iteration_s", "sim_iteration_s", "ratio", ...}`` for one experiment file.

    Needs root (the emulated run). ``work_dir`` keeps both results directories (``emu/`` and
    ``sim/``); by default they go to a temporary directory that is removed. ``overrides`` are
    config fields to replace (``semantics``, ``switching_delay``, ...).
    """
    from testbed.emulated.runner import run_emulated
    from testbed.errors import RunError
    from testbed.experiment.config import EMULATOR, FABRIC
    from testbed.experiment.dilation import dilated_costs
    from testbed.experiment.prepare import prepare
    from testbed.metrics.compute import compute_metrics
    from testbed.simulator.network import (
        COST_MODEL_TEXT,
        EMULATOR_COSTS,
        FABRIC_COSTS,
        network_model,
    )
    from testbed.simulator.run import run_simulated, simulate_plan

    if os.geteuid() != 0:
        raise RunError("cross-validation runs the emulator: it needs root "
                              "(sudo opus-testbed bench crossval ...)")
    cfg = load_experiment(config_path)
    if overrides:
        cfg = cfg.replace(**overrides)
    prep = prepare(cfg, costs=EMULATOR)  # the simulated side models the emulator, not the fabric
    with tempfile.TemporaryDirectory(prefix="opus-crossval-") as tmp:
        base = work_dir if work_dir is not None else Path(tmp)
        say(f"cross-validation of {cfg.source}: emulated run")
        emu = run_emulated(prep, base / "emu", say)
        prefixes = sorted(p.name for p in (base / "emu" / "emulator").iterdir()
                          if p.is_dir()) if (base / "emu" / "emulator").exists() else []
        costs = measure_costs(base / "emu")
        say(f"cross-validation: simulated run (costs {EMULATOR}: "
            f"{COST_MODEL_TEXT[EMULATOR]}; its times / {prep.time_dilation:g}, the run's time "
            "dilation)")
        seeds = [cfg.seed + 1 + i for i in range(max(1, sim_seeds))]
        # the emulator's fixed costs in model time at the run's dilation
        k = prep.time_dilation
        net = network_model(prep.link_mbps, cfg.latency_us,
                            dilated_costs(EMULATOR_COSTS, k))
        sim = run_simulated(prep, base / "sim", say, seed=seeds[0], network=net)
    sim_times = list(sim.get("iteration_times_s") or [])
    for seed in seeds[1:]:
        records, events = simulate_plan(prep, seed=seed, network=net)
        sim_times += compute_metrics(records, events, warmup=cfg.warmup,
                                     link_mbps=prep.link_mbps, scale=prep.scale,
                                     num_rails=cfg.workload.cluster.gpus_per_server
                                     ).summary["iteration_times_s"]
    # the datacenter's figure (issue 34's fabric model): what the testbed still adds beside it
    fabric = prepare(cfg, check_capacity=False, costs=FABRIC)
    records, events = simulate_plan(fabric, seed=seeds[0], network=network_model(
        fabric.link_mbps, cfg.latency_us, FABRIC_COSTS))
    fabric_it = compute_metrics(records, events, warmup=cfg.warmup,
                                link_mbps=fabric.link_mbps, scale=fabric.scale,
                                num_rails=cfg.workload.cluster.gpus_per_server
                                ).summary.get("iteration_time_s")
    emu_times = list(emu.get("iteration_times_s") or [])
    emu_it = statistics.mean(emu_times) if emu_times else None
    sim_it = statistics.mean(sim_times) if sim_times else None
    return {
        "config": str(config_path), "mode": cfg.mode, "semantics": cfg.effective_semantics,
        "switching_delay_ms": cfg.switching_delay_ms, "world_size": prep.schedule.world_size,
        "link_mbps": prep.link_mbps, "sim_costs": prep.costs,
        "time_dilation": prep.time_dilation,
        "sim_costs_divided_by": prep.time_dilation,
        "emu_call_cost_bound": emu.get("call_cost_bound"),
        "fabric_iteration_s": fabric_it,
        "emu_minus_fabric_pct": (100.0 * (emu_it / fabric_it - 1.0)
                                 if emu_it and fabric_it else None),
        "emu_iteration_s": emu_it, "sim_iteration_s": sim_it,
        "ratio": (sim_it / emu_it) if emu_it and sim_it is not None else None,
        "emu_iteration_times_s": emu.get("iteration_times_s"),
        "sim_iteration_times_s": sim_times, "sim_seeds": seeds,
        "emu_reconfigurations": emu.get("reconfigurations"),
        "emu_reconfigurations_per_iteration": emu.get("reconfigurations_per_iteration"),
        "sim_reconfigurations_per_iteration": sim.get("reconfigurations_per_iteration"),
        "emu_exposed_reconfig_s": emu.get("exposed_reconfig_s"),
        "sim_exposed_reconfig_s": sim.get("exposed_reconfig_s"),
        "emu_fidelity": emu.get("fidelity"), "emu_fidelity_blame": emu.get("fidelity_blame"),
        "emu_fidelity_reasons": emu.get("fidelity_reasons"), "emu_wall_s": emu.get("wall_s"),
        "emu_dark_error_ms": emu.get("dark_error_ms"),
        "sim_wall_s": sim.get("wall_s"), "measured_costs": costs,
        "emu_prefix": prefixes[0] if prefixes else None,
        "work_dir": str(work_dir) if work_dir is not None else None,
        **degraded_marks(emu, sim),
    }


def degraded_marks(emu: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """The keys of :func:`run_crossval`'s result that say which of its two runs (``emulated``,
    ``simulated``) are degraded: ``rests_on_degraded``, ``degraded_runs`` (their verdicts)
    and ``degraded_figures`` (:data:`FIGURES` when any run is)."""
    runs = [("emulated", emu), ("simulated", sim)]
    rests_on = degraded_labels(runs)
    return {RESTS_ON: rests_on, "degraded_runs": degraded_runs(runs),
            "degraded_figures": list(FIGURES) if rests_on else []}


def run_crossval_points(config_path: str | Path, semantics: Sequence[str],
                        delays_ms: Sequence[float], *, work_dir: Path | None = None,
                        say: Say = say_stderr, sim_seeds: int = 5,
                        overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:func:`run_crossval` of the config at every (semantics, delay) point, in the config's
    mode (a 0 ms point switches in no time; it is not the electrical baseline); per point the
    agreement ``|emu - sim| / sim`` and whether it is within :data:`AGREEMENT_BOUND`.
    ``overrides`` apply to every point (``time_dilation``, ...)."""
    points = []
    for sem in semantics:
        for delay in delays_ms:
            say(f"cross-validation point: {sem}, {delay:g} ms")
            keep = work_dir / f"{sem}-{delay:g}ms" if work_dir is not None else None
            res = run_crossval(config_path, work_dir=keep, say=say, sim_seeds=sim_seeds,
                               overrides={**(overrides or {}), "semantics": sem,
                                          "switching_delay": float(delay)})
            points.append(crossval_point(sem, float(delay), res))
    rests_on = union(*(p[RESTS_ON] for p in points))
    return {"config": str(config_path), "bound_pct": 100.0 * AGREEMENT_BOUND,
            "all_within_bound": all(p["within_bound"] for p in points),
            "worst_agreement_pct": max((p["agreement_pct"] for p in points
                                        if p["agreement_pct"] is not None), default=None),
            RESTS_ON: rests_on,
            "degraded_runs": {label: v for p in points
                              for label, v in p["degraded_runs"].items()},
            "degraded_figures": list(POINTS_FIGURES) if rests_on else [],
            "points": points}


def crossval_point(semantics: str, delay_ms: float, res: dict[str, Any]) -> dict[str, Any]:
    """One point of :func:`run_crossval_points` from its :func:`run_crossval` result ``res``:
    the agreement, whether it is within the bound, and the degraded runs it rests on (labels
    ``SEMANTICS D ms: emulated``)."""
    emu, sim = res["emu_iteration_s"], res["sim_iteration_s"]
    agreement = abs(emu - sim) / sim if emu and sim else None
    prefix = f"{semantics} {delay_ms:g} ms: "
    return {"semantics": semantics, "delay_ms": delay_ms, "emu_iteration_s": emu,
            "sim_iteration_s": sim,
            "agreement_pct": None if agreement is None else 100.0 * agreement,
            "within_bound": agreement is not None and agreement <= AGREEMENT_BOUND,
            RESTS_ON: [prefix + x for x in res.get(RESTS_ON, [])],
            "degraded_runs": {prefix + x: v for x, v in res.get("degraded_runs", {}).items()},
            "detail": res}
