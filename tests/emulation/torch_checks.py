"""What every PyTorch job trained on the emulated rails must show, for the torch and TorchTitan
emulation tests: rails switched, every step done on every rank, every byte delivered, losses
bit-identical to the job's own loopback run, and the fidelity gate."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.torchjob.config import load_torch_experiment
from testbed.torchjob.runner import run_torch


def train_shipped_job(example: Path, out: Path, no_leftovers: list[str],
                      fidelity_gate: Callable[..., None], losses_per_step: int
                      ) -> dict[str, Any]:
    """Train ``example`` (4 ranks, on demand, 3 steps) on the rails into ``out``, assert the
    above (``losses_per_step``: how many ranks log the step's loss) and return its summary."""
    exp = load_torch_experiment(example)
    assert (exp.mode, exp.world_size, exp.total_iterations) == ("on-demand", 4, 3)
    summary = run_torch(exp, out, say=lambda _m: None)
    no_leftovers.append(json.loads((out / "manifest.json").read_text())["prefix"])
    assert summary["reconfigurations"] > 0
    assert summary["all_iterations_completed"] and summary["iterations_completed"] == 3
    assert summary["loss_max_abs_diff"] == 0.0
    assert summary["losses_compared"] == losses_per_step * 3
    assert summary["calls"] == summary["calls_delivered"] > 0
    assert summary["bytes_received_scaled"] == summary["bytes_expected_scaled"] > 0
    fidelity_gate(summary, out, delay_ms=summary["switching_delay_ms"])
    return summary


def job_groups(out: Path) -> set[str]:
    """The communication groups the run registered with Opus."""
    return {g["id"] for g in json.loads((out / "manifest.json").read_text())["job"]["groups"]}
