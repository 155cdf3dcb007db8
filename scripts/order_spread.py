"""How far a run's model-time figures move with the arrival order of simultaneous requests
alone: the simulator, under the emulator's per-call costs divided by each factor ``k`` (what a
run at time dilation ``k`` keeps of them, :func:`testbed.experiment.dilation.dilated_costs`),
once per seed (the seed draws the control round trips' jitter, so it orders the requests that
the model makes simultaneous). docs/validation.md 11.3 ("Why port-exact's figures move").

    .venv/bin/python scripts/order_spread.py FILE MODE SEMANTICS [FACTORS] [SEEDS]

e.g. ``scripts/order_spread.py examples/demo.yaml on-demand port-exact 1,4,1000 10``. Prints
one JSON line per factor: the iterations' and reconfigurations' values per seed, their
distinct values and their spread (max / min - 1, %).
"""

from __future__ import annotations

import json
import sys

from testbed.experiment.config import load_experiment
from testbed.experiment.dilation import dilated_costs
from testbed.metrics.compute import compute_metrics
from testbed.simulator.network import EMULATOR_COSTS, network_model
from testbed.simulator.run import prepare_sim, simulate_plan


def spread(path: str, mode: str, semantics: str, factors: list[float], seeds: int
           ) -> list[dict[str, object]]:
    """One row per factor: each seed's mean iteration (s) and reconfigurations per iteration."""
    cfg = load_experiment(path).replace(mode=mode, semantics=semantics)
    prep = prepare_sim(cfg, costs="emulator")
    rows = []
    for k in factors:
        net = network_model(prep.link_mbps, cfg.latency_us, dilated_costs(EMULATOR_COSTS, k))
        its, reconfs = [], []
        for seed in range(1, seeds + 1):
            records, events = simulate_plan(prep, seed=seed, network=net)
            s = compute_metrics(records, events, warmup=cfg.warmup, link_mbps=prep.link_mbps,
                                scale=prep.scale, num_rails=cfg.workload.cluster.gpus_per_server,
                                switched=mode != "baseline").summary
            its.append(round(float(s["iteration_time_s"]), 3))
            reconfs.append(float(s["reconfigurations_per_iteration"]))
        rows.append({"file": path, "mode": mode, "semantics": semantics, "k": k,
                     "iteration_s": its, "distinct_iteration_s": sorted(set(its)),
                     "spread_pct": round(100 * (max(its) / min(its) - 1), 1),
                     "reconfigurations_per_iteration": reconfs})
    return rows


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4, 5) or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    factors = [float(x) for x in (argv[3] if len(argv) > 3 else "1,2,4").split(",")]
    seeds = int(argv[4]) if len(argv) > 4 else 5
    for row in spread(argv[0], argv[1], argv[2], factors, seeds):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
