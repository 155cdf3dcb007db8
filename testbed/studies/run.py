"""One experiment run end to end on a backend, alone or after its electrical baseline.

The unit the command line's ``run`` and the demo are made of: it picks the backend (the
emulator, the simulator, or a PyTorch job on the emulated rails) and, with a baseline, judges
the run against it (:func:`testbed.results.baseline.with_baseline`), on disk too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.errors import RunRefused, Say
from testbed.experiment.config import ExperimentConfig
from testbed.results import store
from testbed.results.baseline import with_baseline
from testbed.torchjob.config import TorchExperiment


def run_one(cfg: ExperimentConfig | TorchExperiment, out: Path, backend: str,
            say: Say) -> dict[str, Any]:
    """Run ``cfg`` on ``backend`` (``emu`` or ``sim``) into ``out``; its summary."""
    if isinstance(cfg, TorchExperiment):
        if backend == "sim":
            raise RunRefused(f"{cfg.source}: a PyTorch script runs on the emulated rails only; "
                             "its run writes replay.yaml (the captured schedule), which "
                             "`run --backend sim` replays")
        from testbed.torchjob.runner import run_torch

        return run_torch(cfg, out, say)
    if backend == "sim":  # under the file's cost model, sim.costs (--costs)
        from testbed.simulator.run import prepare_sim, run_simulated

        return run_simulated(prepare_sim(cfg), out, say)
    from testbed.emulated.runner import run_emulated
    from testbed.experiment.prepare import prepare

    return run_emulated(prepare(cfg), out, say)


@dataclass(frozen=True)
class Outcome:
    """A finished ``run``: its summary (with the overhead when a baseline ran first), the
    directory holding it, and the directory of everything it wrote (the parent of both runs
    with a baseline)."""

    summary: dict[str, Any]
    run_dir: Path
    root: Path
    has_baseline: bool


def run_experiment(cfg: ExperimentConfig | TorchExperiment, out: Path, backend: str,
                   say: Say, baseline: bool = False) -> Outcome:
    """Run ``cfg`` into ``out``; with ``baseline`` (and an OCS mode) the electrical baseline
    first into ``out/baseline``, then the run into ``out/MODE``, judged against it."""
    if not baseline or cfg.mode == "baseline":
        return Outcome(run_one(cfg, out, backend, say), out, out, False)
    base = run_one(cfg.replace(mode="baseline"), out / "baseline", backend, say)
    run_dir = out / cfg.mode
    summary = with_baseline(run_one(cfg, run_dir, backend, say), base)
    store.write_json(run_dir / "summary.json", summary)
    return Outcome(summary, run_dir, out, True)
