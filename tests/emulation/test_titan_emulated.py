"""TorchTitan's own trainer on the emulated rails: ``llama3_debugmodel``, FSDP 2 x PP 2 (1F1B) on
4 ranks, 3 steps, through Opus on demand, against its own loopback run.

Judged as the tiny torch job is (:mod:`test_torch_emulated`): rails switched, every step done,
every byte delivered, losses bit-identical to loopback, and the fidelity gate. Skipped (with
the fix) when torchtitan is not installed, unless CI asks for it.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.check import ci_requested
from testbed.torchjob.config import load_torch_experiment
from testbed.torchjob.runner import run_torch

if importlib.util.find_spec("torchtitan") is None and not ci_requested():
    pytest.skip("torchtitan is not installed (bash scripts/setup.sh installs it)",
                allow_module_level=True)

EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "torchtitan"
           / "llama3-debug-4x1.yaml")


@pytest.mark.slow
def test_torchtitan_trains_on_demand_with_bit_identical_losses(
        tmp_path: Path, no_leftovers: list[str], fidelity_gate: Callable[..., None]) -> None:
    exp = load_torch_experiment(EXAMPLE)
    assert (exp.mode, exp.world_size, exp.total_iterations) == ("on-demand", 4, 3)
    out = tmp_path / "run"
    summary = run_torch(exp, out, say=lambda _m: None)
    no_leftovers.append(json.loads((out / "manifest.json").read_text())["prefix"])
    assert summary["reconfigurations"] > 0
    assert summary["all_iterations_completed"] and summary["iterations_completed"] == 3
    assert summary["loss_max_abs_diff"] == 0.0
    assert summary["losses_compared"] == 4 * 3  # every rank logs the step's loss
    assert summary["calls"] == summary["calls_delivered"] > 0
    assert summary["bytes_received_scaled"] == summary["bytes_expected_scaled"] > 0
    fidelity_gate(summary, out, delay_ms=summary["switching_delay_ms"])
    groups = {g["id"] for g in json.loads((out / "manifest.json").read_text())["job"]["groups"]}
    assert {"fsdp0-1", "fsdp2-3", "p2p0-2", "p2p1-3"} <= groups
    assert summary["capture"] == str(out / "workload.json")
