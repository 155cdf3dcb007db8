"""A PyTorch job on the emulated rails: the shipped tiny Llama (FSDP2 x PP 1F1B, 4 ranks on one
rail, K = 1) trained through Opus on demand, against its own loopback run.

The run is judged on correctness only: rails switched, every step completed on every rank,
every call delivered all its bytes, and the losses are bit-identical to the loopback
reference's. Four torch processes saturate this machine's two cores by design, so the
verdict's timing reasons are not asserted; what holds under any load is (the fidelity gate).
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from torch_checks import job_groups, train_shipped_job

from testbed.check import ci_requested
from testbed.experiment.config import load_experiment
from testbed.studies.run import run_one

if importlib.util.find_spec("torch") is None and not ci_requested():
    pytest.skip("torch is not installed (bash scripts/setup.sh installs it)",
                allow_module_level=True)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch" / "llama-tiny-4x1.yaml"


def _calls(run_dir: Path, rank: int) -> list[dict]:
    lines = (run_dir / "ranks" / f"rank{rank}.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["ev"] == "call"]


def test_the_shipped_job_trains_on_demand_with_bit_identical_losses(
        tmp_path: Path, no_leftovers: list[str], fidelity_gate: Callable[..., None]) -> None:
    out = tmp_path / "run"
    summary = train_shipped_job(EXAMPLE, out, no_leftovers, fidelity_gate,
                                losses_per_step=2)  # the last stage's two ranks
    groups = job_groups(out)
    assert groups == {"fsdp0-1", "fsdp2-3", "p2p0-2", "p2p1-3"}
    for rank in range(4):
        plan = json.loads((out / "ranks" / f"rank{rank}.plan.json").read_text())
        # data to the peers' rail addresses; only the rendezvous store on the frontend
        assert all(addr.startswith("198.19.") for addr, _ in plan["peers"].values())
        assert plan["master_addr"].startswith("198.18.") and plan["endpoint"]
        rails, loopback = _calls(out, rank), _calls(out / "reference", rank)
        assert Counter((c["op"], c["lane"], c["size_bytes"]) for c in rails) == Counter(
            (c["op"], c["lane"], c["size_bytes"]) for c in loopback)
        assert {c["lane"] for c in rails} <= groups
    # the captured last step replays like a generated schedule, with the job's real bytes
    assert summary["capture"] == str(out / "workload.json")
    replay = run_one(load_experiment(out / "replay.yaml"), tmp_path / "replay", "sim",
                     say=lambda _m: None)
    assert replay["all_iterations_completed"] and replay["reconfigurations"] > 0
    assert replay["scale"] == 1.0
