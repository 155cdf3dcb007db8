"""The fabric's prediction of a run's overhead, for ``auto`` time dilation.

``auto`` bounds late light's share of the overhead a run carries against its baseline (the
verdict's 5 %), and with provisioning that overhead can be far smaller than the switching it
overlaps: the paper's Llama3-8B at 25 ms carries +5 % while it switches 56 times an
iteration. The experiment layer cannot run the simulator (the import order), so the studies
that start emulated runs hand :func:`fabric_overhead` to
:func:`testbed.experiment.prepare.prepare`.
"""

from __future__ import annotations

from testbed.experiment.config import FABRIC, ExperimentConfig
from testbed.experiment.dilation import OverheadPrediction
from testbed.metrics.compute import exposed_intervals


def fabric_overhead(cfg: ExperimentConfig) -> OverheadPrediction | None:
    """The overhead ``cfg``'s run is predicted to carry (model time, s) and its switches per
    iteration on every rail that some collective waited for: the fabric simulation's mean
    measured iteration (one, after the warm-up that provisioning profiles) minus the modelled
    step, which the fabric's baseline matches within 0.23 % for every example
    (docs/validation.md 10), and the switches whose light came while a call waited for it
    (the verdict counts late light only there); None where it cannot be simulated (the
    caller then predicts without it)."""
    from testbed.simulator.engine import SimulationError
    from testbed.simulator.run import prepare_sim, simulate_plan

    try:
        prep = prepare_sim(cfg.replace(iterations=1), costs=FABRIC)
        records, events = simulate_plan(prep)
    except (SimulationError, ValueError):
        return None
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    for r in records:  # an iteration runs from its first rank's start to its last rank's end
        if r.get("ev") == "iteration" and int(r["it"]) >= prep.config.warmup:
            it = int(r["it"])
            starts[it] = min(starts.get(it, float("inf")), float(r["t_start"]))
            ends[it] = max(ends.get(it, float("-inf")), float(r["t_end"]))
    if not ends:
        return None
    mean_s = sum(ends[it] - starts[it] for it in ends) / len(ends)
    waits = [(a, b) for a, b, _group, _seq in exposed_intervals(events)]
    waited = sum(1 for e in events if e.get("event") == "reconfig_end"
                 and (t := e.get("t_light_s")) is not None
                 and any(starts[it] <= float(t) <= ends[it] for it in ends)
                 and any(a < float(t) <= b for a, b in waits))
    return OverheadPrediction(mean_s - prep.modeled_iteration_s, waited / len(ends))
