"""Calibrate a workload's compute to a measured step time (``workload.calibrate_step_s``).

The generator's compute durations come from FLOPs, the GPU's peak rate and an assumed MFU, so
its modelled step is only as long as those guesses. A measured step (e.g. the Opus artifact's
10.18 s for TorchTitan's Llama3-8B without any controller) fixes the length instead: every
compute duration is multiplied by one factor, ``compute_scale``, chosen so that the modelled
step on electrical rails (:func:`workloads.timing.simulate`, the alpha-beta model with no
switching; what a run reports as ``modeled_iteration_s``) equals the target. Communication is
not scaled: its volumes are the workload's.

The modelled step is a longest path through the DAG of one iteration, a maximum of sums with
every compute duration entering with a non-negative coefficient, so it is a continuous,
non-decreasing (convex, piecewise linear) function of the scale. At scale 0 it is the
communication alone; a target at or below that cannot be reached and is refused. Otherwise
the scale is found by regula falsi (Illinois variant) inside a bracket, to a relative error
of the step of at most :data:`REL_TOL`. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from workloads.builder import generate_schedule
from workloads.config import WorkloadConfig
from workloads.errors import WorkloadConfigError
from workloads.schedule import Program, Schedule
from workloads.timing import TimingModel, simulate

FIELD = "workload.calibrate_step_s"
#: Relative error of the calibrated modelled step.
REL_TOL = 1e-9
MAX_ITERATIONS = 200
MAX_SCALE = 1e6


@dataclass(frozen=True)
class Calibration:
    """The factor found, the modelled step it gives, and the step with no compute at all."""

    compute_scale: float
    modeled_step_s: float
    communication_s: float


def modeled_step_s(schedule: Schedule, model: TimingModel) -> float:
    """The modelled electrical step of ``schedule``: the end of its last op."""
    times = simulate(schedule, model)
    return max((end for _, end in times.values()), default=0.0)


def with_compute_scaled(schedule: Schedule, factor: float) -> Schedule:
    """``schedule`` with every compute duration multiplied by ``factor``."""
    programs = [Program(p.stage, p.ep_index, tuple(
        dataclasses.replace(op, duration_s=op.duration_s * factor) if op.kind == "compute"
        else op for op in p.ops)) for p in schedule.programs]
    return Schedule(schedule.config, schedule.groups, programs, schedule.program_of)


def find_compute_scale(cfg: WorkloadConfig, target_step_s: float,
                       model: TimingModel | None = None) -> Calibration:
    """The ``compute_scale`` whose modelled step is ``target_step_s``.

    Raises :class:`WorkloadConfigError` (field ``workload.calibrate_step_s``) when the target
    is not above the communication time alone, naming that time.
    """
    model = model or TimingModel()
    if not target_step_s > 0:
        raise WorkloadConfigError(f"must be > 0 s, got {target_step_s!r}", FIELD)
    base = generate_schedule(dataclasses.replace(cfg, compute_scale=1.0,
                                                 calibrate_step_s=None))

    def step(scale: float) -> float:
        return modeled_step_s(with_compute_scaled(base, scale), model)

    comm_s = step(0.0)
    if target_step_s <= comm_s:
        raise WorkloadConfigError(
            f"{target_step_s:g} s cannot be reached: the step's communication alone takes "
            f"{comm_s:.4g} s in the model (rail rate and latency of the experiment); give a "
            "longer step or remove the key", FIELD)
    lo, f_lo = 0.0, comm_s
    hi, f_hi = 1.0, step(1.0)
    while f_hi < target_step_s:
        lo, f_lo = hi, f_hi
        hi *= 2.0
        if hi > MAX_SCALE:
            raise WorkloadConfigError(
                f"{target_step_s:g} s would need compute {MAX_SCALE:g} times longer than the "
                "model's; check the workload (model, batch, MFU)", FIELD)
        f_hi = step(hi)
    best = (hi, f_hi)
    side = 0
    for _ in range(MAX_ITERATIONS):
        if abs(best[1] - target_step_s) <= REL_TOL * target_step_s:
            break
        # regula falsi on the bracket; the Illinois rule halves the weight of an end kept
        # twice in a row, so a convex function cannot pin one end forever
        mid = lo + (target_step_s - f_lo) * (hi - lo) / (f_hi - f_lo)
        if not lo < mid < hi:
            mid = 0.5 * (lo + hi)
        f_mid = step(mid)
        best = min(best, (mid, f_mid), key=lambda p: abs(p[1] - target_step_s))
        if f_mid < target_step_s:
            lo, f_lo = mid, f_mid
            if side == -1:
                f_hi = target_step_s + 0.5 * (f_hi - target_step_s)
            side = -1
        else:
            hi, f_hi = mid, f_mid
            if side == 1:
                f_lo = target_step_s - 0.5 * (target_step_s - f_lo)
            side = 1
    return Calibration(best[0], best[1], comm_s)


def calibrate(cfg: WorkloadConfig, model: TimingModel | None = None) -> WorkloadConfig:
    """``cfg`` with ``compute_scale`` set from its ``calibrate_step_s`` (unchanged without)."""
    if cfg.calibrate_step_s is None:
        return cfg
    found = find_compute_scale(cfg, cfg.calibrate_step_s, model)
    return dataclasses.replace(cfg, compute_scale=found.compute_scale)
