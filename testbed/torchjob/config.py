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
``run.seed``.

TorchTitan's own trainer runs the same way (:mod:`testbed.torchjob.titan_main` is the script)::

    workload:
      torchtitan:
        module: llama3                     # --module (a TorchTitan model package)
        config: llama3_debugmodel          # --config (a function of its config_registry)
        overrides: [--parallelism.data_parallel_shard_degree, 2, ...]

The trainer gets ``--training.steps {steps} --debug.seed {seed}``, the compatibility flags
(:data:`testbed.torchjob.titan_compat.REQUIRED_ARGS`), then the overrides (which may use the
same placeholders). TorchTitan's ``batch`` and ``loss_mesh`` meshes count as the ``fsdp``
axis (:data:`TITAN_AXES`; with a replicate dimension, name them in ``axes``).

``mode``, ``ocs``, ``network`` and ``run`` are those of every experiment
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
from workloads.loader import TOP_LEVEL_KEYS
from workloads.yamldoc import YamlDoc, load_file

TORCH_KEYS = ("script", "args", "axes")
TITAN_KEYS = ("module", "config", "overrides", "axes")
TITAN_SCRIPT = Path(__file__).resolve().parent / "titan_main.py"
# TorchTitan's data-parallel meshes besides ``fsdp``: the batch (token counts) and loss
# (logged loss) all-reduces run on the FSDP group when there is no replicate dimension
TITAN_AXES = {"mesh_batch": "fsdp", "mesh_loss_mesh": "fsdp"}
PLACEHOLDERS = ("steps", "seed")


@dataclass(frozen=True)
class TorchWorkload:
    """The script every rank runs, its arguments (with placeholders) and axis names."""

    script: Path
    args: tuple[str, ...] = ()
    axes: dict[str, str] = field(default_factory=dict)
    titan: dict[str, str] | None = None  # TorchTitan's module and config, for a titan job

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
    return isinstance(workload, dict) and ("torch" in workload or "torchtitan" in workload)


def parse_torch_experiment(text: str, source: str = "<string>", base_dir: Path | None = None
                           ) -> TorchExperiment:
    """Parse and validate an experiment document with a torch workload."""
    doc = YamlDoc(text, source)
    top = doc.mapping(doc.root if doc.root is not None else {}, "", TOP_LEVEL_KEYS)
    for key in ("cluster", "workload"):
        if key not in top:
            raise doc.error(key, "required top-level mapping is missing")
    cluster = doc.mapping(top["cluster"], "cluster", None)
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
        value = doc.typed(cluster[key], f"cluster.{key}", int)
        if value < 1:
            raise doc.error(f"cluster.{key}", f"must be an integer >= 1, got {value}")
        sizes[key] = value
    workload = doc.mapping(top["workload"], "workload", ("torch", "torchtitan"))
    if len(workload) != 1:
        raise doc.error("workload", "needs exactly one of torch or torchtitan")
    if "torchtitan" in workload:
        torch = _titan_workload(doc, doc.mapping(workload["torchtitan"],
                                              "workload.torchtitan", TITAN_KEYS))
    else:
        torch = _torch_workload(doc, doc.mapping(workload["torch"], "workload.torch",
                                              TORCH_KEYS), base_dir or Path("."))
    return doc.validated(TorchExperiment(torch=torch, cluster=Cluster(**sizes),
                                           **run_settings(doc, top, text)))


def _torch_workload(doc: YamlDoc, data: dict[str, Any], base_dir: Path) -> TorchWorkload:
    if "script" not in data:
        raise doc.error("workload.torch.script", "required: the training script to run")
    script = (base_dir / doc.typed(data["script"], "workload.torch.script", str)).resolve()
    if not script.is_file():
        raise doc.error("workload.torch.script", f"no such file: {script}")
    args = _arguments(doc, data.get("args", []), "workload.torch.args")
    axes = _axes(doc, data, "workload.torch")
    return TorchWorkload(script, tuple(args), axes)


def _titan_workload(doc: YamlDoc, data: dict[str, Any]) -> TorchWorkload:
    from testbed.torchjob.titan_compat import REQUIRED_ARGS

    names: dict[str, str] = {}
    for key in ("module", "config"):
        if key not in data:
            raise doc.error(f"workload.torchtitan.{key}", "required (e.g. module: llama3, "
                            "config: llama3_debugmodel)")
        value = doc.typed(data[key], f"workload.torchtitan.{key}", str)
        if not value or value.startswith("-") or any(c.isspace() for c in value):
            raise doc.error(f"workload.torchtitan.{key}", f"not a name: {value!r}")
        names[key] = value
    overrides = _arguments(doc, data.get("overrides", []), "workload.torchtitan.overrides")
    for i, value in enumerate(overrides):
        if value.split("=")[0] in ("--module", "--config", "--training.steps", "--debug.seed"):
            raise doc.error(f"workload.torchtitan.overrides[{i}]", f"{value} is set by the "
                            "testbed (module and config keys; run.warmup + run.iterations; "
                            "run.seed)")
    args = ["--module", names["module"], "--config", names["config"], *REQUIRED_ARGS,
            "--training.steps", "{steps}", "--debug.seed", "{seed}", *overrides]
    axes = {**TITAN_AXES, **_axes(doc, data, "workload.torchtitan")}
    return TorchWorkload(TITAN_SCRIPT, tuple(args), axes, titan=names)


def _arguments(doc: YamlDoc, raw: Any, where: str) -> list[str]:
    """A list of command-line arguments, numbers as text, placeholders checked."""
    if not isinstance(raw, list):
        raise doc.error(where, "must be a list of arguments")
    args = []
    for i, value in enumerate(raw):
        path = f"{where}[{i}]"
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
    return args


def _axes(doc: YamlDoc, data: dict[str, Any], where: str) -> dict[str, str]:
    axes = doc.mapping(data.get("axes", {}), f"{where}.axes", None)
    for desc, axis in axes.items():
        doc.typed(axis, f"{where}.axes.{desc}", str)
    return {str(k): str(v) for k, v in axes.items()}


def load_torch_experiment(path: str | Path) -> TorchExperiment:
    """Read and validate the torch experiment file at ``path``."""
    return load_file(path, parse_torch_experiment, ExperimentError)
