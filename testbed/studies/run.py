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
from testbed.experiment.dilation import AUTO
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
    from testbed.experiment.prepare import prepare

    prep = prepare(cfg, check_capacity=backend == "emu")
    if backend == "sim":
        from testbed.simulator.run import run_simulated

        return run_simulated(prep, out, say)
    from testbed.emulated.runner import run_emulated

    return run_emulated(prep, out, say)


@dataclass(frozen=True)
class Outcome:
    """A finished ``run``: its summary (with the overhead when a baseline ran first), the
    directory holding it, and the directory of everything it wrote (the parent of both runs
    with a baseline)."""

    summary: dict[str, Any]
    run_dir: Path
    root: Path
    has_baseline: bool


def shared_dilation(cfg: ExperimentConfig, backend: str, say: Say) -> ExperimentConfig:
    """``cfg`` with ``auto`` time dilation resolved for its own (OCS) run, so that the runs
    set against each other (its baseline, a demo's rows) share the factor: their per-call
    costs are then alike in model time. Unchanged off the emulator or with a set factor."""
    if backend != "emu" or cfg.time_dilation != AUTO:
        return cfg
    from testbed.experiment.prepare import prepare

    prep = prepare(cfg)
    if prep.dilation is not None:
        say(f"{cfg.name}: {prep.dilation.text()}; its baseline runs at it too")
    return cfg.replace(time_dilation=prep.time_dilation)


def run_experiment(cfg: ExperimentConfig | TorchExperiment, out: Path, backend: str,
                   say: Say, baseline: bool = False) -> Outcome:
    """Run ``cfg`` into ``out``; with ``baseline`` (and an OCS mode) the electrical baseline
    first into ``out/baseline``, then the run into ``out/MODE``, judged against it, at the
    same time dilation (:func:`shared_dilation`)."""
    if not baseline or cfg.mode == "baseline":
        return Outcome(run_one(cfg, out, backend, say), out, out, False)
    if isinstance(cfg, ExperimentConfig):
        cfg = shared_dilation(cfg, backend, say)
    base = run_one(cfg.replace(mode="baseline"), out / "baseline", backend, say)
    run_dir = out / cfg.mode
    summary = with_baseline(run_one(cfg, run_dir, backend, say), base)
    store.write_json(run_dir / "summary.json", summary)
    return Outcome(summary, run_dir, out, True)
