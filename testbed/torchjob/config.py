"""Experiment files whose workload is a PyTorch script.

::

    name: llama-tiny-4x1
    cluster: {servers: 4, gpus_per_server: 1}
    workload:
      torch:
        script: train_llama_tiny.py       # relative to this file
        args: [--pp, 2, --fsdp, 2, --steps, "{steps}", --seed, "{seed}"]
        axes: {mesh_fsdp: fsdp}           # optional: torch group descriptor -> axis
    mode: on-demand
    ocs: {switching_delay: 10}
    network: {link_mbps: 100}
    run: {warmup: 1, iterations: 2}

``{steps}`` in the arguments becomes the run's iterations (warm-up included) and ``{seed}``
``run.seed``. ``mode``, ``ocs``, ``network`` and ``run`` are those of every experiment
(:mod:`testbed.experiment.config`); the tensors are real, so no bytes are scaled and
``network.rail_gbps`` plays no part. Errors name the key and its ``file:line:column``.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.experiment.config import ExperimentError, RunSettings, run_settings
from workloads.hardware import Cluster
from workloads.loader import TOP_LEVEL_KEYS, _Doc, _load_file, _mapping, _typed, _validated

TORCH_KEYS = ("script", "args", "axes")
PLACEHOLDERS = ("steps", "seed")


@dataclass(frozen=True)
class TorchWorkload:
    """The script every rank runs, its arguments (with placeholders) and axis names."""

    script: Path
    args: tuple[str, ...] = ()
    axes: dict[str, str] = field(default_factory=dict)

    def argv(self, *, steps: int, seed: int) -> list[str]:
        """The arguments with ``{steps}`` and ``{seed}`` filled in."""
        return [a.format(steps=steps, seed=seed) for a in self.args]


@dataclass(frozen=True, kw_only=True)
class TorchExperiment(RunSettings):
    """A validated experiment that trains a PyTorch script on the emulated rails."""

    torch: TorchWorkload
    cluster: Cluster

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    def _rail_state_problems(self) -> list[tuple[str, bool, str]]:
        return [("ocs.semantics", True, "a torch job runs port-exact: its groups are known only "
                 "at run time, and the bit model needs a schedule's pipeline stages and request "
                 "points (replay the job's capture, replay.yaml, under rail-state instead)")]


def is_torch_experiment(path: str | Path) -> bool:
    """True when the experiment file at ``path`` has a ``workload: {torch: ...}``."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    workload = data.get("workload") if isinstance(data, dict) else None
    return isinstance(workload, dict) and "torch" in workload


def parse_torch_experiment(text: str, source: str = "<string>", base_dir: Path | None = None
                           ) -> TorchExperiment:
    """Parse and validate an experiment document with a torch workload."""
    doc = _Doc(text, source)
    top = _mapping(doc, doc.root if doc.root is not None else {}, "", TOP_LEVEL_KEYS)
    for key in ("cluster", "workload"):
        if key not in top:
            raise doc.error(key, "required top-level mapping is missing")
    cluster = _mapping(doc, top["cluster"], "cluster", None)
    for key in ("faults", "failover", "cluster.spares_per_server", "cluster.spare_servers"):
        parent, _, leaf = key.rpartition(".")
        if leaf in (cluster if parent else top):
            raise doc.error(key, "a torch job cannot fail over (the script's state lives in its "
                            "processes): spares and faults need a replayed schedule; replay "
                            "the job's capture (replay.yaml) with them instead")
    sizes = {}
    for key in ("servers", "gpus_per_server"):
        if key not in cluster:
            raise doc.error(f"cluster.{key}", "required")
        value = _typed(doc, cluster[key], f"cluster.{key}", int)
        if value < 1:
            raise doc.error(f"cluster.{key}", f"must be an integer >= 1, got {value}")
        sizes[key] = value
    workload = _mapping(doc, top["workload"], "workload", ("torch",))
    torch = _torch_workload(doc, _mapping(doc, workload["torch"], "workload.torch", TORCH_KEYS),
                            base_dir or Path("."))
    return _validated(doc, TorchExperiment(torch=torch, cluster=Cluster(**sizes),
                                           **run_settings(doc, top, text)))


def _torch_workload(doc: _Doc, data: dict[str, Any], base_dir: Path) -> TorchWorkload:
    if "script" not in data:
        raise doc.error("workload.torch.script", "required: the training script to run")
    script = (base_dir / _typed(doc, data["script"], "workload.torch.script", str)).resolve()
    if not script.is_file():
        raise doc.error("workload.torch.script", f"no such file: {script}")
    raw = data.get("args", [])
    if not isinstance(raw, list):
        raise doc.error("workload.torch.args", "must be a list of arguments")
    args = []
    for i, value in enumerate(raw):
        path = f"workload.torch.args[{i}]"
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise doc.error(path, f"must be a string or a number, got {value!r}")
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(str(value)) if f is not None]
        except ValueError as exc:
            raise doc.error(path, f"bad placeholder in {value!r}: {exc}") from exc
        unknown = [n for n in names if n not in PLACEHOLDERS]
        if unknown:
            raise doc.error(path, f"unknown placeholder {{{unknown[0]}}}; use "
                            + " or ".join(f"{{{p}}}" for p in PLACEHOLDERS))
        args.append(str(value))
    axes = _mapping(doc, data.get("axes", {}), "workload.torch.axes", None)
    for desc, axis in axes.items():
        _typed(doc, axis, f"workload.torch.axes.{desc}", str)
    return TorchWorkload(script, tuple(args), {str(k): str(v) for k, v in axes.items()})


def load_torch_experiment(path: str | Path) -> TorchExperiment:
    """Read and validate the torch experiment file at ``path``."""
    return _load_file(path, parse_torch_experiment, ExperimentError)
