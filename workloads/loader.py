"""Load the workload part of an experiment YAML file, with positions in every error.

Layout of the file (other top-level keys belong to the rest of the testbed and are ignored
here, anything else is rejected)::

    cluster: {servers: 4, gpus_per_server: 4}     # other keys of cluster are not read here
    workload:
      model: llama3-8b            # a preset, a path to a model YAML, or a mapping
      gpu: a100                   # a100 | h100 | h200 | b200
      mfu: 0.4
      seq_len: 8192
      micro_batch_size: 1
      num_microbatches: 8
      activation_checkpointing: none   # none | full
      loss_logging_allreduces: 0
      calibrate_step_s: 10.18          # optional: scale compute to this modelled step
      parallelism: {tp: 4, sp: false, dp: 1, fsdp: 2, pp: 2, pp_schedule: 1f1b,
                    reshard_after_forward: default, ...}   # default | always | never
      algorithms:                 # optional; defaults: ring, and pairwise for all_to_all
        all_to_all: matchings     # every all-to-all, or per axis: {ep: multihop}
        all_reduce: {dp: stragglar}
      stragglers: [{rank: 7, delay_ms: 50}]   # or one mapping

or, to replay a captured or imported schedule instead of generating one::

    workload: {schedule: capture/workload.json}   # relative to the experiment file

(the file's cluster must be the experiment's). A model mapping takes the fields of
:class:`workloads.models.ModelSpec`; with ``base: NAME`` it overrides a preset. The YAML node
tree is composed (not just loaded, :mod:`workloads.yamldoc`) so that each value keeps its
``line:column`` for error messages.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workloads.config import Straggler, WorkloadConfig
from workloads.errors import WorkloadConfigError
from workloads.hardware import Cluster, get_gpu
from workloads.models import ModelSpec, get_preset
from workloads.parallel import RESHARD_POLICIES, ParallelConfig
from workloads.schedule import Schedule
from workloads.timing import TimingModel
from workloads.yamldoc import YamlDoc, load_file

TOP_LEVEL_KEYS = ("workload", "cluster", "ocs", "mode", "run", "network", "name", "description",
                  "faults", "failover", "artifact_protocol", "sim", "controller")
WORKLOAD_KEYS = ("model", "gpu", "mfu", "seq_len", "micro_batch_size", "num_microbatches",
                 "parallelism", "ddp_bucket_mb", "param_dtype_bytes", "reduce_dtype_bytes",
                 "act_dtype_bytes", "activation_checkpointing", "loss_logging_allreduces",
                 "calibrate_step_s", "algorithms", "stragglers")
STRAGGLER_KEYS = ("rank", "delay_ms")


def _model(doc: YamlDoc, value: Any, base_dir: Path) -> ModelSpec:
    path = "workload.model"
    if isinstance(value, str):
        if value.endswith((".yaml", ".yml")):
            file = (base_dir / value).resolve()
            try:
                text = file.read_text()
            except OSError as exc:
                raise doc.error(path, f"cannot read model file {file}: {exc}") from exc
            sub = YamlDoc(text, str(file))
            data = sub.mapping(sub.root, "", None)
            return _model_mapping(sub, data, "")
        try:
            return get_preset(value)
        except WorkloadConfigError as exc:
            raise doc.error(path, exc.reason) from exc
    return _model_mapping(doc, doc.mapping(value, path, None), path)


def _model_mapping(doc: YamlDoc, data: dict, path: str) -> ModelSpec:
    data = dict(data)
    base_name = data.pop("base", None)
    kwargs = doc.fields_of(ModelSpec, data, path or "model")
    try:
        if base_name is not None:
            base = get_preset(doc.typed(base_name, f"{path}.base", str)).to_dict()
            base.update(kwargs)
            base.setdefault("name", base_name)
            kwargs = base
        if "name" not in kwargs:
            raise doc.error(f"{path}.name", "required for a custom model")
        spec = ModelSpec(**kwargs)
        spec.validate(path or "model")
    except WorkloadConfigError as exc:
        raise doc.error(exc.field or path, exc.reason) from exc
    except TypeError as exc:
        raise doc.error(path, f"missing architecture numbers: {exc}") from exc
    return spec


@dataclass(frozen=True)
class WorkloadSource:
    """An experiment's workload: a configuration to generate from, or a schedule file."""

    config: WorkloadConfig
    schedule_file: Path | None = None

    def schedule(self) -> Schedule:
        """The schedule: loaded from ``schedule_file``, else generated from ``config``."""
        if self.schedule_file is not None:
            from workloads.schedule import load

            return load(self.schedule_file)
        from workloads.builder import generate_schedule

        return generate_schedule(self.config)


def parse_workload(text: str, source: str = "<string>", base_dir: Path | None = None,
                   timing: TimingModel | None = None) -> WorkloadConfig:
    """Parse and validate the workload of an experiment YAML document; with ``timing``, also
    calibrate its compute to ``calibrate_step_s`` under that model (:func:`calibrated`)."""
    return parse_workload_source(text, source, base_dir, timing).config


def parse_workload_source(text: str, source: str = "<string>", base_dir: Path | None = None,
                          timing: TimingModel | None = None) -> WorkloadSource:
    """Parse the workload of an experiment YAML document: a configuration or a schedule file
    (a configuration calibrated under ``timing`` when given)."""
    doc = YamlDoc(text, source)
    top = doc.mapping(doc.root if doc.root is not None else {}, "", TOP_LEVEL_KEYS)
    if "workload" not in top:
        raise doc.error("workload", "required top-level mapping is missing")
    if "cluster" not in top:
        raise doc.error("cluster", "required top-level mapping is missing")
    cl = doc.mapping(top["cluster"], "cluster", None)
    for key in ("servers", "gpus_per_server"):
        if key not in cl:
            raise doc.error(f"cluster.{key}", "required")
        doc.typed(cl[key], f"cluster.{key}", int)
    cluster = Cluster(cl["servers"], cl["gpus_per_server"])
    wl = doc.mapping(top["workload"], "workload", (*WORKLOAD_KEYS, "schedule"))
    if "schedule" in wl:
        return _schedule_source(doc, wl, cluster, base_dir or Path("."))
    if "model" not in wl:
        raise doc.error("workload.model", "required")
    model = _model(doc, wl["model"], base_dir or Path("."))
    par = _parallelism(doc, wl.get("parallelism", {}))
    kwargs: dict[str, Any] = {}
    for key in ("seq_len", "micro_batch_size", "num_microbatches", "param_dtype_bytes",
                "reduce_dtype_bytes", "act_dtype_bytes", "loss_logging_allreduces"):
        if key in wl:
            kwargs[key] = doc.typed(wl[key], f"workload.{key}", int)
    for key in ("mfu", "ddp_bucket_mb", "calibrate_step_s"):
        if key in wl:
            kwargs[key] = doc.typed(wl[key], f"workload.{key}", float)
    if "activation_checkpointing" in wl:
        kwargs["activation_checkpointing"] = doc.typed(
            wl["activation_checkpointing"], "workload.activation_checkpointing", str)
    if "gpu" in wl:
        try:
            kwargs["gpu"] = get_gpu(doc.typed(wl["gpu"], "workload.gpu", str))
        except WorkloadConfigError as exc:
            raise doc.error("workload.gpu", exc.reason) from exc
    if "algorithms" in wl:
        kwargs["algorithms"] = _algorithms(doc, wl["algorithms"])
    if "stragglers" in wl:
        kwargs["stragglers"] = _stragglers(doc, wl["stragglers"])
    cfg = doc.validated(WorkloadConfig(model=model, cluster=cluster, parallel=par, **kwargs))
    return WorkloadSource(cfg if timing is None else calibrated(doc, cfg, timing))


def calibrated(doc: YamlDoc, cfg: WorkloadConfig, timing: TimingModel) -> WorkloadConfig:
    """``cfg`` calibrated to its ``calibrate_step_s`` (:mod:`workloads.calibrate`); a target
    the model cannot reach is refused at the key's position in ``doc``."""
    from workloads.calibrate import calibrate  # it generates schedules (the builder)

    try:
        return calibrate(cfg, timing)
    except WorkloadConfigError as exc:
        raise doc.error(exc.field, exc.reason) from exc


def _parallelism(doc: YamlDoc, value: Any) -> ParallelConfig:
    """``workload.parallelism``; ``reshard_after_forward`` takes TorchTitan's names
    (``default | always | never``) or ``true``/``false`` (aliases of always/never)."""
    path = "workload.parallelism"
    data = dict(doc.mapping(value, path, None))
    reshard: bool | None = None
    if "reshard_after_forward" in data:
        key = f"{path}.reshard_after_forward"
        raw = data.pop("reshard_after_forward")
        if isinstance(raw, bool):
            reshard = raw
        elif isinstance(raw, str) and raw in RESHARD_POLICIES:
            reshard = RESHARD_POLICIES[raw]
        elif raw is not None:
            raise doc.error(key, f"must be one of {', '.join(RESHARD_POLICIES)} (or true/false), "
                            f"got {raw!r}")
    return ParallelConfig(**doc.fields_of(ParallelConfig, data, path),
                          reshard_after_forward=reshard)


def _schedule_source(doc: YamlDoc, wl: dict, cluster: Cluster, base_dir: Path) -> WorkloadSource:
    """``workload: {schedule: FILE}``: the schedule must load and run on the file's cluster."""
    from workloads.schedule import load

    others = [k for k in wl if k != "schedule"]
    if others:
        raise doc.error(f"workload.{others[0]}", "not allowed with 'schedule' (the schedule "
                        "file replaces the model and its parallelism)")
    file = (base_dir / doc.typed(wl["schedule"], "workload.schedule", str)).resolve()
    try:
        schedule = load(file)
    except WorkloadConfigError as exc:
        raise doc.error("workload.schedule", str(exc)) from exc
    have = schedule.cluster
    if (have.servers, have.gpus_per_server) != (cluster.servers, cluster.gpus_per_server):
        raise doc.error("cluster", f"the schedule {file} is for {have.servers} servers x "
                        f"{have.gpus_per_server} GPUs, not {cluster.servers} x "
                        f"{cluster.gpus_per_server}; change the cluster (or re-import with "
                        "--gpus-per-server)")
    return WorkloadSource(schedule.config, file)


def _algorithms(doc: YamlDoc, value: Any) -> tuple[tuple[str, str, str], ...]:
    """``{kind: algorithm}`` or ``{kind: {axis: algorithm}}`` as (kind, axis, algorithm)."""
    out = []
    for kind, choice in doc.mapping(value, "workload.algorithms", None).items():
        path = f"workload.algorithms.{kind}"
        if isinstance(choice, dict):
            for axis, name in choice.items():
                out.append((str(kind), str(axis), doc.typed(name, f"{path}.{axis}", str)))
        else:
            out.append((str(kind), "", doc.typed(choice, path, str)))
    return tuple(out)


def _stragglers(doc: YamlDoc, value: Any) -> tuple[Straggler, ...]:
    """One ``{rank, delay_ms}`` mapping or a list of them."""
    path = "workload.stragglers"
    if isinstance(value, dict):  # one straggler: its keys answer to the list form's paths
        for key in [k for k in doc.marks if k == path or k.startswith(f"{path}.")]:
            doc.marks.setdefault(f"{path}[0]{key[len(path):]}", doc.marks[key])
        value = [value]
    if not isinstance(value, list):
        raise doc.error(path, "must be a mapping {rank, delay_ms} or a list of them")
    out = []
    for i, item in enumerate(value):
        sub = f"{path}[{i}]"
        data = doc.mapping(item, sub, STRAGGLER_KEYS)
        for key in STRAGGLER_KEYS:
            if key not in data:
                raise doc.error(f"{sub}.{key}", "required")
        out.append(Straggler(doc.typed(data["rank"], f"{sub}.rank", int),
                             doc.typed(data["delay_ms"], f"{sub}.delay_ms", float) / 1e3))
    return tuple(out)


def load_experiment_workload(path: str | Path, timing: TimingModel | None = None
                             ) -> WorkloadConfig:
    """Read ``path`` and return its validated workload configuration (calibrated under
    ``timing`` when given)."""
    return load_workload_source(path, timing).config


def parse_timing(text: str, source: str = "<string>") -> TimingModel:
    """The timing model of an experiment document's ``network:`` (``rail_gbps``, ``latency_us``;
    :class:`TimingModel`'s defaults for what it leaves out), as ``run`` uses it."""
    doc = YamlDoc(text, source)
    top = doc.mapping(doc.root if doc.root is not None else {}, "", TOP_LEVEL_KEYS)
    net = doc.mapping(top.get("network", {}), "network", None)
    kwargs: dict[str, float] = {}
    if "rail_gbps" in net:
        kwargs["rail_gbps"] = doc.typed(net["rail_gbps"], "network.rail_gbps", float)
        if kwargs["rail_gbps"] <= 0:
            raise doc.error("network.rail_gbps", "must be positive")
    if "latency_us" in net:
        kwargs["latency_s"] = doc.typed(net["latency_us"], "network.latency_us", float) * 1e-6
    return TimingModel(**kwargs)


def load_timing(path: str | Path) -> TimingModel:
    """:func:`parse_timing` of the file at ``path``."""
    return load_file(path, lambda text, source, _dir: parse_timing(text, source))


def load_workload_source(path: str | Path, timing: TimingModel | None = None
                         ) -> WorkloadSource:
    """Read ``path`` and return its workload: a configuration or a schedule file (a
    configuration calibrated under ``timing`` when given)."""
    return load_file(path, functools.partial(parse_workload_source, timing=timing))
