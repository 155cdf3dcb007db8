"""TorchTitan's own trainer on the emulated rails: ``llama3_debugmodel``, FSDP 2 x PP 2 (1F1B) on
4 ranks, 3 steps, through Opus on demand, against its own loopback run.

Judged as the tiny torch job is (:mod:`test_torch_emulated`): rails switched, every step done,
every byte delivered, losses bit-identical to loopback, and the fidelity gate. Skipped (with
the fix) when torchtitan is not installed, unless CI asks for it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest
from torch_checks import job_groups, train_shipped_job

from testbed.check import ci_requested

if importlib.util.find_spec("torchtitan") is None and not ci_requested():
    pytest.skip("torchtitan is not installed (bash scripts/setup.sh installs it)",
                allow_module_level=True)

EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "torchtitan"
           / "llama3-debug-4x1.yaml")


@pytest.mark.slow
def test_torchtitan_trains_on_demand_with_bit_identical_losses(
        tmp_path: Path, no_leftovers: list[str], fidelity_gate: Callable[..., None]) -> None:
    out = tmp_path / "run"
    summary = train_shipped_job(EXAMPLE, out, no_leftovers, fidelity_gate,
                                losses_per_step=4)  # every rank logs the step's loss
    assert {"fsdp0-1", "fsdp2-3", "p2p0-2", "p2p1-3"} <= job_groups(out)
    assert summary["capture"] == str(out / "workload.json")
