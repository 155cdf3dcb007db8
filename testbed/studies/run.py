"""One experiment run end to end on a backend, alone or after its electrical baseline.

The unit the command line's ``run`` and the demo are made of: it picks the backend (the
emulator, the simulator, or a PyTorch job on the emulated rails) and, with a baseline, judges
the run against it (:func:`testbed.results.baseline.with_baseline`), on disk too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.backends import get_backend, resolve
from testbed.errors import Say, require_empty_dir
from testbed.experiment.config import ExperimentConfig
from testbed.experiment.dilation import AUTO
from testbed.results import store
from testbed.results.baseline import adopt_baseline_windows, with_baseline
from testbed.torchjob.config import TorchExperiment

if TYPE_CHECKING:
    from testbed.experiment.prepare import Prepared


def check_one(cfg: ExperimentConfig | TorchExperiment, backend: str) -> Prepared | None:
    """Every check of ``cfg`` on ``backend`` that needs nothing started: the schedule, the job
    (each comm group's circuits against the ports per rank), the algorithms, this machine's
    capacity; :class:`RunRefused` (or the experiment's error) naming what fails. Returns the
    prepared run (None for a PyTorch script's, which its runner checks). ``backend``: a name
    of :data:`testbed.backends.SELECTABLE` (:func:`testbed.backends.resolve` says what each
    refuses)."""
    return resolve(cfg, backend).check(cfg)


def run_one(cfg: ExperimentConfig | TorchExperiment, out: Path, backend: str,
            say: Say, prep: Prepared | None = None) -> dict[str, Any]:
    """Run ``cfg`` on ``backend`` (``emu`` or ``sim``) into ``out``; its summary. ``prep``:
    :func:`check_one`'s result when the caller checked first."""
    chosen = resolve(cfg, backend)
    return chosen.run(cfg, out, say, prep if prep is not None else chosen.check(cfg))


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
    costs are then alike in model time. With a baseline, the verdict bounds late light's share
    of the overhead, so ``auto`` predicts it from the fabric's simulation
    (:func:`testbed.studies.predict.fabric_overhead`). Unchanged off the emulator or with a set
    factor."""
    if not get_backend(backend).spec.dilates or cfg.time_dilation != AUTO:
        return cfg
    from testbed.experiment.prepare import prepare
    from testbed.studies.predict import fabric_overhead

    prep = prepare(cfg, predict_overhead=fabric_overhead)
    if prep.dilation is not None:
        say(f"{cfg.name}: {prep.dilation.text()}; its baseline runs at it too")
    return cfg.replace(time_dilation=prep.time_dilation)


def run_experiment(cfg: ExperimentConfig | TorchExperiment, out: Path, backend: str,
                   say: Say, baseline: bool = False) -> Outcome:
    """Run ``cfg`` into ``out``; with ``baseline`` (and an OCS mode) the electrical baseline
    first into ``out/baseline``, then the run into ``out/MODE``, judged against it; with
    ``auto`` time dilation the baseline runs at the factor the run gets."""
    if not baseline or cfg.mode == "baseline":
        return Outcome(run_one(cfg, out, backend, say), out, out, False)
    base_cfg, run_dir = cfg.replace(mode="baseline"), out / cfg.mode
    # every check of both runs before either starts: a job the rails cannot carry, or a busy
    # folder, must not be found after the baseline ran (its folder would block the retry)
    for path in (out / "baseline", run_dir):
        require_empty_dir(path)
    run_prep = check_one(cfg, backend)
    if run_prep is not None and run_prep.dilation is not None and cfg.time_dilation == AUTO:
        # the baseline at the run's factor: their per-call costs alike in model time
        base_cfg = base_cfg.replace(time_dilation=run_prep.time_dilation)
        say(f"{cfg.name}: {run_prep.dilation.text()}; its baseline runs at it too")
    base_prep = check_one(base_cfg, backend)
    base = run_one(base_cfg, out / "baseline", backend, say, base_prep)
    summary = with_baseline(run_one(cfg, run_dir, backend, say, run_prep), base)
    adopt_baseline_windows(run_dir, out / "baseline", summary)
    store.write_json(run_dir / "summary.json", summary)
    return Outcome(summary, run_dir, out, True)
