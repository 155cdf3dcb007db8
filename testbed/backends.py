"""Backends by name: what each supports (:mod:`testbed.experiment.backends`), how it checks an
experiment and how it runs one.

Every place that runs an experiment "on a backend" (``run``, ``sweep``, ``bench failover``,
``bench alltoall``/``stragglar``, the demo) resolves the name here instead of comparing strings:
:func:`resolve` picks the entry for an experiment (a PyTorch script's goes to ``torch``) and
refuses, with the entry's reason, what it cannot run; :meth:`Backend.check` prepares the run
without starting anything; :meth:`Backend.run` runs it into a results directory. Adding a
backend means one :class:`~testbed.experiment.backends.BackendSpec` (its refusals) and one
:class:`Backend` line in :data:`REGISTRY`, shaped like the OCS drivers' registry
(:mod:`controller.drivers.registry`).

The runners are imported when a backend runs, not when this module loads: a simulated run
never loads Mininet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.errors import RunRefused, Say
from testbed.experiment.backends import (
    ARTIFACT_PROTOCOL,
    BACKEND_NAMES,
    DYNAMIC_RELAY_PATHS,
    EMU,
    RIVAL_PLANE,
    ROTOR_PLANE,
    SELECTABLE,
    SIM,
    SPECS,
    TORCH,
    TORCH_SCRIPT,
    BackendSpec,
    UnknownBackend,
    backend_spec,
)
from testbed.experiment.config import ExperimentConfig
from testbed.torchjob.config import TorchExperiment

if TYPE_CHECKING:
    from testbed.experiment.prepare import Prepared

__all__ = ["BACKEND_NAMES", "EMU", "REGISTRY", "SELECTABLE", "SIM", "TORCH", "Backend",
           "UnknownBackend", "get_backend", "resolve"]

Experiment = ExperimentConfig | TorchExperiment
#: checks an experiment without starting anything: its prepared run (None: the runner checks)
Check = Callable[[Experiment], "Prepared | None"]
#: runs an experiment (prepared by the check when given) into a directory; its summary
Run = Callable[[Experiment, Path, Say, "Prepared | None"], dict[str, Any]]


@dataclass(frozen=True)
class Backend:
    """One backend: its :class:`BackendSpec` (what it supports), its check and its run."""

    spec: BackendSpec
    check: Check
    run: Run

    @property
    def name(self) -> str:
        return self.spec.name


def _replayed(cfg: Experiment, backend: str) -> ExperimentConfig:
    if not isinstance(cfg, ExperimentConfig):
        raise RunRefused(f"{cfg.source}: the {backend} backend replays a schedule; a PyTorch "
                         "script runs on the torch backend")
    return cfg


def _check_emu(cfg: Experiment) -> Prepared:
    from testbed.experiment.prepare import prepare

    return prepare(_replayed(cfg, EMU), check_capacity=True)


def _run_emu(cfg: Experiment, out: Path, say: Say, prep: Prepared | None) -> dict[str, Any]:
    from testbed.emulated.runner import run_emulated

    return run_emulated(prep or _check_emu(cfg), out, say)


def _check_sim(cfg: Experiment) -> Prepared:
    """Under the file's cost model, ``sim.costs`` (``--costs``)."""
    from testbed.simulator.run import prepare_sim

    return prepare_sim(_replayed(cfg, SIM))


def _run_sim(cfg: Experiment, out: Path, say: Say, prep: Prepared | None) -> dict[str, Any]:
    from testbed.simulator.run import run_simulated

    return run_simulated(prep or _check_sim(cfg), out, say)


def _check_torch(cfg: Experiment) -> None:
    """A script's checks need its runner (torch installed, the groups it forms): it checks."""
    if not isinstance(cfg, TorchExperiment):
        raise RunRefused(f"{cfg.source}: the torch backend runs a PyTorch script "
                         "(workload.torch or workload.torchtitan); this file replays a schedule")


def _run_torch(cfg: Experiment, out: Path, say: Say, _prep: Prepared | None) -> dict[str, Any]:
    from testbed.torchjob.runner import run_torch

    _check_torch(cfg)
    assert isinstance(cfg, TorchExperiment)
    return run_torch(cfg, out, say)


REGISTRY: dict[str, Backend] = {b.name: b for b in (
    Backend(SPECS[EMU], _check_emu, _run_emu),
    Backend(SPECS[SIM], _check_sim, _run_sim),
    Backend(SPECS[TORCH], _check_torch, _run_torch),
)}
assert tuple(REGISTRY) == BACKEND_NAMES, "every BackendSpec needs its Backend"


def get_backend(name: str) -> Backend:
    """The backend ``name``; :class:`UnknownBackend` (a :class:`RunRefused`) lists the known
    ones."""
    return REGISTRY[backend_spec(name).name]


def resolve(cfg: Experiment, name: str) -> Backend:
    """The backend that runs ``cfg`` when ``name`` is asked for (``--backend``): ``name``'s,
    or ``torch`` for a PyTorch script's experiment on a backend that hands scripts to it.
    :class:`RunRefused` names the file and the reason when the backend refuses what the file
    asks for (nothing is started)."""
    asked = get_backend(name)
    script = isinstance(cfg, TorchExperiment)
    if not asked.spec.selectable and not script:
        raise RunRefused(f"{cfg.source}: backend {name!r} is chosen by the experiment file, "
                         f"not asked for; choose from {', '.join(SELECTABLE)}")
    backend = REGISTRY[TORCH] if script and asked.spec.supports(TORCH_SCRIPT) else asked
    if cfg.artifact_port is not None:
        for b in (asked, backend):
            b.spec.require(ARTIFACT_PROTOCOL, cfg.source)
    if script:
        asked.spec.require(TORCH_SCRIPT, cfg.source)
    if getattr(cfg, "rival_plane", False):  # controller.plane static or rotor (issue 40)
        backend.spec.require(RIVAL_PLANE, cfg.source)
        if cfg.control_plane == "rotor":
            backend.spec.require(ROTOR_PLANE, cfg.source)
        elif cfg.relay_paths == "dynamic":
            backend.spec.require(DYNAMIC_RELAY_PATHS, cfg.source)
    return backend
