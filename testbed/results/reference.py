"""The public Opus artifact's measured step times, to draw beside a sweep (numbers only).

Source (figures copied, no code): ``opusfabric/Opus`` at commit
``53f8d514c07c64a6b9ce838ca3da8fd53ef67e8c``, ``evaluation/llama-3-3d-16-latency/``:

* ``latency_results_provision_v3_baseline.csv``: switching on demand;
* ``latency_results_provision_v5_provision.csv``: with provisioning;
* ``provision.ipynb``: the run without a controller (10.1775 s), the overhead's baseline, and
  the step time definition: the mean of the 6 intervals between the log times of steps 4 and
  10, one run per point.

Setup (``torchtitan/opus-test/dp-2-pp-2-tp-4-pm-8b/llama3_8b_lb.toml``): Llama3-8B, TP4 FSDP2
PP2 on 4 x 4 A100 (Perlmutter), local batch 8 of 8192 tokens in 2 micro-batches, full
activation checkpointing, reshard after forward "always", the artifact's rail-state controller
(:mod:`controller.railstate`). The paper's Fig. 8 text gives +6.5 % (on demand) and +3.5 %
(provisioning) at 100 ms, from a simulation of its §3.1 trace against 0 ms.
"""

from __future__ import annotations

from typing import Any

from testbed.metrics.fit import fit_line

SOURCE = ("opusfabric/Opus@53f8d514c07c64a6b9ce838ca3da8fd53ef67e8c "
          "evaluation/llama-3-3d-16-latency/latency_results_provision_v3_baseline.csv, "
          "latency_results_provision_v5_provision.csv, provision.ipynb")
#: Step time without a controller (s): the artifact's overhead baseline.
NO_CONTROLLER_S = 10.1775
#: mode -> switching delay (ms) -> mean step time (s).
STEP_S: dict[str, dict[float, float]] = {
    "on-demand": {0: 10.4415, 10: 10.4607, 50: 10.6815, 100: 10.9043, 250: 11.8843,
                  500: 13.1078, 750: 14.1565, 1000: 15.4008, 2000: 21.2268, 3000: 27.3225},
    "provisioning": {0: 10.2220, 10: 10.3705, 50: 10.3203, 100: 10.6142, 250: 11.2692,
                     500: 12.5570, 750: 13.9538, 1000: 15.1215, 2000: 20.3465,
                     3000: 26.4348},
}
#: The paper's Fig. 8 text: overhead at 100 ms (%), simulated, against 0 ms.
PAPER_FIG8_100MS_PCT = {"on-demand": 6.5, "provisioning": 3.5}


#: The artifact's workload as this project's config spells it (tensor parallelism stays inside
#: a server, off the rails, so the 4-rank scaled config matches too).
ARTIFACT_WORKLOAD = {"model": "llama3-8b", "seq_len": 8192, "micro_batch_size": 4,
                     "num_microbatches": 2, "fsdp": 2, "pp": 2,
                     "activation_checkpointing": "full"}


def workload_signature(workload: Any) -> dict[str, Any]:
    """The fields of a :class:`workloads.config.WorkloadConfig` that :data:`ARTIFACT_WORKLOAD`
    names."""
    return {"model": workload.model.name if workload.model else None,
            "seq_len": workload.seq_len, "micro_batch_size": workload.micro_batch_size,
            "num_microbatches": workload.num_microbatches, "fsdp": workload.parallel.fsdp,
            "pp": workload.parallel.pp,
            "activation_checkpointing": workload.activation_checkpointing}


def matches_artifact(workload: Any) -> bool:
    """True when a sweep's workload is the artifact's, so its points belong on the plot."""
    return workload_signature(workload) == ARTIFACT_WORKLOAD


def artifact_reference(min_delay_ms: float = 250.0) -> dict[str, Any]:
    """The artifact's points (step time, overhead against no controller) and per mode the
    least-squares slope over the points at or above ``min_delay_ms``, as a sweep reports."""
    points = [{"mode": mode, "delay_ms": float(d), "step_s": t,
               "overhead_pct": 100.0 * (t / NO_CONTROLLER_S - 1.0)}
              for mode, by_delay in STEP_S.items() for d, t in by_delay.items()]
    families = []
    for mode, by_delay in STEP_S.items():
        line = fit_line([(d / 1e3, t) for d, t in by_delay.items() if d >= min_delay_ms])
        assert line is not None
        families.append({"mode": mode, "slope_s_per_s": line[0], "intercept_s": line[1],
                         "overhead_100ms_pct": 100.0 * (by_delay[100] / NO_CONTROLLER_S - 1)})
    return {"source": SOURCE, "no_controller_s": NO_CONTROLLER_S, "points": points,
            "families": families, "paper_fig8_100ms_pct": PAPER_FIG8_100MS_PCT}
