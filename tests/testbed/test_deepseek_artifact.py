"""The DeepSeek-V3 16B example of the Opus artifact loads calibrated and runs on the sim."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.experiment.config import load_experiment
from testbed.experiment.prepare import prepare
from testbed.simulator.run import run_simulated

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "deepseek-v3-16b-artifact.yaml"


def test_the_example_loads_calibrated_to_the_artifacts_step() -> None:
    cfg = load_experiment(EXAMPLE)
    w = cfg.workload
    assert w.model_spec.name == "deepseek-v3-16b" and w.model_spec.is_mla
    assert (w.calibrate_step_s, w.parallel.pp_layer_split, cfg.semantics) == (
        13.46, "torchtitan", "rail-state")
    assert w.compute_scale > 1.0
    assert prepare(cfg, check_capacity=False).modeled_iteration_s == pytest.approx(13.46,
                                                                                   rel=1e-6)


@pytest.mark.parametrize("mode", ["on-demand", "provisioning"])
def test_one_iteration_runs_on_the_sim(mode: str, tmp_path: Path) -> None:
    cfg = load_experiment(EXAMPLE).replace(mode=mode, warmup=0, iterations=1)
    s = run_simulated(prepare(cfg, check_capacity=False), tmp_path / "run", lambda _m: None)
    assert s["fidelity"] == "simulated"
    assert len(s["iteration_times_s"]) == 1
    # 13.46 s of modelled step, plus switching at the example's 100 ms
    assert 13.0 < s["iteration_times_s"][0] < 16.0
    assert s["reconfigurations_per_iteration"] > 0
