"""``opus-testbed ladder``: what each model difference does to the overhead, one at a time.

The public Opus artifact's figures (:mod:`testbed.results.reference`) and this testbed's differ
in several modelling choices at once. To say how much of the gap each choice explains, the
ladder starts from one experiment (normally ``examples/llama3-8b-artifact.yaml``) and changes
**one thing at a time** back to this testbed's other choice, running each variant as a
simulated sweep (:func:`testbed.studies.sweep.run_sweep`): the baseline, then every mode at
every delay. Each rung reports its baseline step, and per mode the overhead at 100 ms and the
slope of step time against delay over the points >= 250 ms
(:func:`testbed.metrics.fit.fit_families`), and its difference from the first rung (the
experiment as written).

Rungs (:data:`RUNGS`), each against the experiment as written:

* ``as-written``: nothing changed;
* ``port-exact``: the one-to-one OCS (``ocs.semantics: port-exact``; every call asks, as
  port-exact requires);
* ``every-call-asks``: the semantics kept, but every call asks the controller
  (``ocs.request_points: every``) instead of the artifact's request points;
* ``reflip``: ``ocs.rail_state_inflight: reflip`` (a rail-state request flips a bit already
  being switched to its value again, as the artifact's controller does);
* ``ack-timeout-10s``: ``ocs.rail_state_ack_timeout_s: 10`` (a rank goes on without its ack
  after 10 s, as the artifact's shim does);
* ``serialize-per-rank``: ``ocs.rail_state_serialize_per_rank: true`` (a rank's requests are
  read one at a time, as the artifact's controller reads each rank's socket);
* ``no-activation-checkpointing``: ``workload.activation_checkpointing: none``;
* ``reshard-default``: ``parallelism.reshard_after_forward: default`` (under PP: keep the
  gathered parameters, one all-gather per unit and step);
* ``micro-batches-8x1``: the same samples per step in micro-batches of 1 (8 micro-batches,
  as ``examples/llama3-8b.yaml``), still calibrated if the experiment is;
* ``uncalibrated``: no ``calibrate_step_s`` (compute from FLOPs at the GPU's MFU);
* ``no-controller-baseline``: the same OCS points, but the overhead is taken against a
  baseline in which no call talks to the controller (the artifact's baseline had no
  controller; this testbed's baseline pays one controller round trip per call). There is no
  experiment-file key for it: the ladder runs the baseline's plan with every call's request
  point cleared (``request_points`` ``none`` of :func:`testbed.plan.requestpoints.gated_calls`),
  on the sim backend only.

A rung that changes nothing this experiment runs (``port-exact`` on a port-exact file, a
rail-state setting on a port-exact file, ``uncalibrated`` on an uncalibrated one...) is not run:
it is listed with ``not_run: "already ..."`` (:func:`unchanged_reason`) and no figures.

The differences are not additive (switching two things at once is not the sum of switching
each); the ladder measures each on its own.

Every figure names the degraded runs it rests on (``rests_on_degraded``, labels ``RUNG: POINT``;
:mod:`testbed.metrics.degraded`): a rung's baseline step on its baseline, its slope and 100 ms
overhead on their points and baseline, a delta on both rungs' figures. ``ladder.json`` lists
them all, with each degraded run's reasons under ``degraded_runs``. Simulated points are never
degraded, so on the sim backend these lists stay empty.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.railstate import JOIN, PORT_EXACT
from testbed.backends import SIM
from testbed.errors import Say, say_stderr
from testbed.experiment.config import ExperimentConfig
from testbed.metrics.degraded import RESTS_ON, as_list, degraded_labels, degraded_runs, union
from testbed.metrics.fit import fit_families
from workloads.config import WorkloadConfig

NO_CONTROLLER = "no-controller-baseline"


class LadderError(ValueError):
    """A ladder that cannot start (unknown rung, output in the way); nothing was run."""


def _workload(cfg: ExperimentConfig, **changes: Any) -> ExperimentConfig:
    return dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, **changes))


def _parallel(w: WorkloadConfig, **changes: Any) -> WorkloadConfig:
    return dataclasses.replace(w, parallel=dataclasses.replace(w.parallel, **changes))


def _micro_batches_of_one(cfg: ExperimentConfig) -> ExperimentConfig:
    w = cfg.workload
    return _workload(cfg, micro_batch_size=1,
                     num_microbatches=w.micro_batch_size * w.num_microbatches)


@dataclass(frozen=True)
class Rung:
    """One variant: its name, what it changes, the change (config -> config), and what a
    file that needs no change already has (``n/a (already ...)``)."""

    name: str
    change: str
    apply: Callable[[ExperimentConfig], ExperimentConfig]
    already: str = ""


RUNGS: tuple[Rung, ...] = (
    Rung("as-written", "nothing (the experiment file as written)", lambda c: c),
    Rung("port-exact", "ocs.semantics: port-exact (one-to-one circuits, every call asks)",
         lambda c: c.replace(semantics=PORT_EXACT, request_points="auto"), "port-exact"),
    Rung("every-call-asks", "ocs.request_points: every (same semantics)",
         lambda c: c.replace(request_points="every"), "every call asks"),
    Rung("reflip", "ocs.rail_state_inflight: reflip (the artifact's controller)",
         lambda c: c.replace(rail_state_inflight="reflip"), "reflip"),
    Rung("ack-timeout-10s", "ocs.rail_state_ack_timeout_s: 10 (the artifact's shim)",
         lambda c: c.replace(rail_state_ack_timeout_s=10.0), "a 10 s ack timeout"),
    Rung("serialize-per-rank", "ocs.rail_state_serialize_per_rank: true (the artifact's "
         "controller)", lambda c: c.replace(rail_state_serialize_per_rank=True),
         "serialized per rank"),
    Rung("no-activation-checkpointing", "workload.activation_checkpointing: none",
         lambda c: _workload(c, activation_checkpointing="none"),
         "no activation checkpointing"),
    Rung("reshard-default", "parallelism.reshard_after_forward: default (kept under PP)",
         lambda c: dataclasses.replace(
             c, workload=_parallel(c.workload, reshard_after_forward=None)),
         "reshard_after_forward: default"),
    Rung("micro-batches-8x1", "micro-batches of 1 sample (same samples per step)",
         _micro_batches_of_one, "micro-batches of 1 sample"),
    Rung("uncalibrated", "no workload.calibrate_step_s (compute from FLOPs at the MFU)",
         lambda c: _workload(c, calibrate_step_s=None, compute_scale=1.0), "uncalibrated"),
    Rung(NO_CONTROLLER, "overhead against a baseline where no call asks the controller",
         lambda c: c),
)

#: Settings only the rail-state controller reads (under port-exact they change nothing).
RAIL_STATE_ONLY: dict[str, Any] = {"rail_state_inflight": JOIN, "rail_state_ack_timeout_s": None,
                                   "rail_state_serialize_per_rank": False,
                                   "rail_state_phase_barrier": False}


def _as_run(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with the settings that change nothing for it put to one value: ``auto``
    request points resolved, and under port-exact the rail-state-only settings at default."""
    out = dataclasses.replace(cfg, request_points=cfg.effective_request_points)
    if cfg.semantics == PORT_EXACT:
        out = dataclasses.replace(out, **RAIL_STATE_ONLY)
    return out


def unchanged_reason(cfg: ExperimentConfig, rung: Rung) -> str | None:
    """Why ``rung`` changes nothing ``cfg`` runs (``already ...``), or None when it does.
    ``as-written`` and ``no-controller-baseline`` (which changes the baseline, not the file)
    always run."""
    if rung.name in ("as-written", NO_CONTROLLER):
        return None
    variant = rung.apply(cfg)
    if _as_run(variant) != _as_run(cfg):
        return None
    if variant == cfg or rung.name not in ("reflip", "ack-timeout-10s", "serialize-per-rank"):
        return f"already {rung.already}"
    return "already port-exact, which ignores it"
RUNG_NAMES = tuple(r.name for r in RUNGS)


def rung_config(cfg: ExperimentConfig, rung: Rung) -> ExperimentConfig:
    """``rung`` applied to ``cfg``, its compute calibrated again when the experiment
    calibrates (the variant's step differs, so does its ``compute_scale``)."""
    from workloads.calibrate import calibrate

    variant = rung.apply(cfg)
    if variant.workload.calibrate_step_s is None or variant.workload == cfg.workload:
        return variant
    return _workload(variant, compute_scale=calibrate(variant.workload,
                                                      variant.timing_model).compute_scale)


def select_rungs(names: Sequence[str] | None) -> list[Rung]:
    """The rungs named (all by default), in :data:`RUNGS` order, always with ``as-written``
    first (every difference is taken against it); unknown names raise :class:`LadderError`."""
    if names is None:
        return list(RUNGS)
    bad = [n for n in names if n not in RUNG_NAMES]
    if bad or not names:
        raise LadderError(f"unknown rungs {bad}; choose from {', '.join(RUNG_NAMES)}")
    return [r for r in RUNGS if r.name == "as-written" or r.name in names]


#: A family's figures and the degraded runs each rests on, as a rung keeps them.
FAMILY_KEYS = ("slope_s_per_s", "overhead_100ms_pct", "slope_rests_on_degraded",
               "overhead_100ms_rests_on_degraded", RESTS_ON)


def _families_by_mode(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f["mode"]: {k: f[k] for k in FAMILY_KEYS} for f in fit_families(rows)}


def _label(row: dict[str, Any]) -> str:
    return str(row.get("point") or row["mode"])


def in_rung(rows: Sequence[dict[str, Any]], rung_name: str) -> list[dict[str, Any]]:
    """Sweep ``rows`` with their point labels (and ``rests_on_degraded``) prefixed
    ``RUNG: ``, so that a ladder's labels say which rung's run they name."""
    return [{**r, "point": f"{rung_name}: {_label(r)}",
             RESTS_ON: [f"{rung_name}: {x}" for x in as_list(r.get(RESTS_ON))]} for r in rows]


def rebase_rows(rows: Sequence[dict[str, Any]], baseline_s: float,
                baseline: dict[str, Any] | None = None, baseline_label: str = "baseline"
                ) -> list[dict[str, Any]]:
    """``rows`` of a sweep with their overheads taken against ``baseline_s`` instead (the
    run ``baseline``, named ``baseline_label``): each overhead then rests on its own run and
    that baseline."""
    out = []
    for r in rows:
        overhead = (None if r.get("iteration_time_s") in (None, "")
                    else 100.0 * (float(r["iteration_time_s"]) / baseline_s - 1.0))
        rests_on = degraded_labels([(_label(r), r)] + [(baseline_label, baseline)] * (
            overhead is not None))
        out.append({**r, "overhead_pct": overhead, RESTS_ON: rests_on})
    return out


def rung_result(rung: Rung, cfg: ExperimentConfig, rows: Sequence[dict[str, Any]],
                baseline_s: float | None, baseline_on: Sequence[str] = ()) -> dict[str, Any]:
    """One rung's entry: its settings, baseline step (and the degraded runs it rests on,
    ``baseline_on``) and per mode slope and 100 ms overhead."""
    w = cfg.workload
    return {"rung": rung.name, "change": rung.change, "semantics": cfg.semantics,
            "request_points": cfg.request_points,
            "activation_checkpointing": w.activation_checkpointing,
            "reshard_after_forward": w.parallel.reshard_after_forward,
            "micro_batch_size": w.micro_batch_size, "num_microbatches": w.num_microbatches,
            "calibrate_step_s": w.calibrate_step_s, "compute_scale": w.compute_scale,
            "baseline_s": baseline_s, "baseline_rests_on_degraded": list(baseline_on),
            "modes": _families_by_mode(rows)}


def with_deltas(rungs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rung with ``delta``: per mode, its slope and 100 ms overhead minus the first
    rung's (None where either is missing), and the degraded runs those differences rest on
    (both rungs' figures')."""
    first = rungs[0]["modes"] if rungs else {}
    out = []
    for r in rungs:
        delta = {}
        for mode, fam in r["modes"].items():
            ref = first.get(mode, {})
            d: dict[str, Any] = {}
            rests_on: list[str] = []
            for k, on in (("slope_s_per_s", "slope_rests_on_degraded"),
                          ("overhead_100ms_pct", "overhead_100ms_rests_on_degraded")):
                d[k] = None if fam.get(k) is None or ref.get(k) is None else fam[k] - ref[k]
                d[on] = [] if d[k] is None else union(fam.get(on, []), ref.get(on, []))
                rests_on = union(rests_on, d[on])
            d[RESTS_ON] = rests_on
            delta[mode] = d
        out.append({**r, "delta": delta})
    return out


def _figure(value: float | None, fmt: str, unit: str) -> str:
    return "n/a" if value is None else f"{format(value, fmt)} {unit}"


def progress_text(rung: dict[str, Any]) -> str:
    """A rung's progress line, its figures formatted as ``ladder``'s table prints them:
    ``baseline 0.132 s; on-demand: +964.9 % at 100 ms, slope 12.00 s/s; ...``."""
    return f"baseline {_figure(rung['baseline_s'], '.3f', 's')}; " + "; ".join(
        f"{m}: {_figure(f['overhead_100ms_pct'], '+.1f', '%')} at 100 ms, "
        f"slope {_figure(f['slope_s_per_s'], '.2f', 's/s')}" for m, f in rung["modes"].items())


def ladder_rests_on(rungs: Sequence[dict[str, Any]]) -> list[str]:
    """Every degraded run some figure of the ladder rests on."""
    return union(*(r.get("baseline_rests_on_degraded", []) for r in rungs),
                 *(fam.get(RESTS_ON, []) for r in rungs for fam in r["modes"].values()))


def _no_controller_baseline(cfg: ExperimentConfig, out: Path) -> dict[str, Any]:
    """The summary of the baseline with no call asking the controller (sim backend)."""
    from testbed.plan.requestpoints import with_request_points
    from testbed.simulator.run import prepare_sim, run_simulated

    prep = prepare_sim(cfg.replace(mode="baseline"))
    prep = dataclasses.replace(prep, plan=with_request_points(prep.plan, "none",
                                                              predict=False))
    return run_simulated(prep, out, lambda _m: None)


def run_ladder(cfg: ExperimentConfig, out: Path, delays_ms: list[float], modes: list[str],
               workers: int = 2, rung_names: Sequence[str] | None = None,
               say: Say = say_stderr) -> dict[str, Any]:
    """Run every rung as a simulated sweep under ``out/<rung>/``; write and return
    ``ladder.json`` (rungs with their deltas from ``as-written``, the artifact's figures).
    A bad mode or delay raises :class:`testbed.studies.sweep.SweepError` before anything
    runs."""
    from testbed.results import store
    from testbed.results.reference import artifact_reference
    from testbed.studies.sweep import run_sweep, sweep_points

    rungs = select_rungs(rung_names)
    unchanged = {r.name: why for r in rungs if (why := unchanged_reason(cfg, r)) is not None}
    configs = [cfg if r.name in unchanged else rung_config(cfg, r)
               for r in rungs]  # refused variants stop before any run
    for variant in configs:
        sweep_points(modes, delays_ms, [variant.semantics])
    if out.exists() and any(out.iterdir()):
        raise LadderError(f"{out} exists and is not empty; choose another --out (nothing was "
                         "changed)")
    results: list[dict[str, Any]] = []
    written: list[dict[str, Any]] = []
    runs: list[tuple[str, dict[str, Any]]] = []  # (label, summary or row) of every run
    for rung, variant in zip(rungs, configs, strict=True):
        if rung.name in unchanged:
            say(f"rung {rung.name}: n/a ({unchanged[rung.name]}), not run")
            results.append({"rung": rung.name, "change": rung.change,
                            "not_run": unchanged[rung.name], "baseline_s": None,
                            "baseline_rests_on_degraded": [], "modes": {}})
            continue
        say(f"rung {rung.name}: {rung.change}")
        if rung.name == NO_CONTROLLER:
            label = f"{rung.name}: baseline"
            summary = _no_controller_baseline(cfg, out / rung.name)
            runs.append((label, summary))
            t = summary.get("iteration_time_s")
            base = None if t is None else float(t)
            rows = rebase_rows(written, base, summary, label) if base else []
            base_on = degraded_labels([(label, summary)])
        else:
            rows = in_rung(run_sweep(variant, delays_ms, modes, out / rung.name, SIM,
                                     workers, lambda _m: None, semantics=[variant.semantics]),
                           rung.name)
            runs += [(r["point"], r) for r in rows]
            baseline = next((r for r in rows if r["mode"] == "baseline"), None)
            base = None if baseline is None else baseline["iteration_time_s"]
            base_on = degraded_labels([(baseline["point"], baseline)]) if (
                baseline is not None and base is not None) else []
            if rung.name == "as-written":
                written = rows
        results.append(rung_result(rung, variant, rows, base, base_on))
        say("  " + progress_text(results[-1]))
    rungs_out = with_deltas(results)
    rests_on = ladder_rests_on(rungs_out)
    ladder = {"name": cfg.name, "source": cfg.source, "backend": SIM,
              "delays_ms": delays_ms, "modes": modes, "rungs": rungs_out,
              RESTS_ON: rests_on,
              "degraded_runs": degraded_runs((x, s) for x, s in runs if x in rests_on),
              "reference": artifact_reference()}
    store.write_json(out / "ladder.json", ladder)
    return ladder
