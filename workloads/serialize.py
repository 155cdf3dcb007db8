"""JSON form of a :class:`~workloads.schedule.Schedule` (described in ``workloads/FORMAT.md``).

Programs are stored column-wise (one list per op field) to keep 16k-rank schedules small; a
load of a dump compares equal to the original.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from workloads.config import ParallelConfig, Straggler, WorkloadConfig
from workloads.errors import WorkloadConfigError
from workloads.hardware import Cluster, GpuSpec
from workloads.layout import AXES, GroupSet
from workloads.models import ModelSpec
from workloads.schedule import Program, Schedule, TemplateOp
from workloads.threads import MAIN_THREAD, THREADS

FORMAT = "opus-testbed/workload-schedule"
VERSION = 1
OP_COLUMNS = ("kind", "tag", "deps", "duration_s", "axis", "size_bytes", "peer_stage", "split")
#: Optional columns, written only when some op differs from the default.
OPTIONAL_COLUMNS = {"thread": MAIN_THREAD}
#: Config fields written only when not at their defaults, so older schedules serialise as before.
OPTIONAL_CONFIG_FIELDS = {"activation_checkpointing": "none", "loss_logging_allreduces": 0,
                          "calibrate_step_s": None, "compute_scale": 1.0,
                          "algorithms": (), "stragglers": ()}
#: The same for the fields of ``model`` (multi-head latent attention) and ``parallel``.
OPTIONAL_MODEL_FIELDS = {"kv_lora_rank": 0, "q_lora_rank": 0, "qk_rope_head_dim": 0,
                         "v_head_dim": 0}
OPTIONAL_PARALLEL_FIELDS = {"pp_layer_split": "even"}


def _drop_defaults(d: dict[str, Any], defaults: dict[str, Any]) -> None:
    for key, default in defaults.items():
        if d[key] == default:
            del d[key]


def config_to_dict(cfg: WorkloadConfig) -> dict[str, Any]:
    d = asdict(cfg)
    _drop_defaults(d, OPTIONAL_CONFIG_FIELDS)
    if d["model"] is not None:
        _drop_defaults(d["model"], OPTIONAL_MODEL_FIELDS)
    _drop_defaults(d["parallel"], OPTIONAL_PARALLEL_FIELDS)
    return d


def config_from_dict(d: dict[str, Any]) -> WorkloadConfig:
    rest = {k: v for k, v in d.items() if k not in ("model", "cluster", "parallel", "gpu",
                                                    "algorithms", "stragglers")}
    model = None if d["model"] is None else ModelSpec(**d["model"])
    return WorkloadConfig(model=model, cluster=Cluster(**d["cluster"]),
                          parallel=ParallelConfig(**d["parallel"]), gpu=GpuSpec(**d["gpu"]),
                          algorithms=tuple(tuple(a) for a in d.get("algorithms", ())),
                          stragglers=tuple(Straggler(**s) for s in d.get("stragglers", ())),
                          **rest)


def program_to_dict(p: Program) -> dict[str, Any]:
    names = OP_COLUMNS + tuple(c for c, default in OPTIONAL_COLUMNS.items()
                               if any(getattr(op, c) != default for op in p.ops))
    cols: dict[str, list[Any]] = {c: [] for c in names}
    for op in p.ops:
        for c in names:
            v = getattr(op, c)
            cols[c].append(list(v) if isinstance(v, tuple) else v)
    return {"stage": p.stage, "ep_index": p.ep_index, "ops": cols}


def program_from_dict(d: dict[str, Any]) -> Program:
    cols = d["ops"]
    n = len(cols["kind"])
    threads = cols.get("thread", [MAIN_THREAD] * n)
    bad = sorted({t for t in threads if t not in THREADS})
    if bad:
        raise WorkloadConfigError(f"unknown threads {bad}; known: {', '.join(THREADS)}",
                                  "programs.ops.thread")
    ops = tuple(
        TemplateOp(kind=cols["kind"][i], tag=cols["tag"][i], deps=tuple(cols["deps"][i]),
                   duration_s=float(cols["duration_s"][i]), axis=cols["axis"][i],
                   size_bytes=int(cols["size_bytes"][i]), peer_stage=int(cols["peer_stage"][i]),
                   split=tuple(cols["split"][i]), thread=str(threads[i]))
        for i in range(n))
    return Program(int(d["stage"]), int(d["ep_index"]), ops)


def to_dict(s: Schedule) -> dict[str, Any]:
    out: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    if s.origin is not None:
        out["origin"] = s.origin
    out.update({
        "config": config_to_dict(s.config),
        "groups": {axis: s.groups[axis].ranks.tolist() for axis in AXES},
        "programs": [program_to_dict(p) for p in s.programs],
        "program_of_rank": s.program_of.tolist(),
    })
    return out


def from_dict(d: dict[str, Any]) -> Schedule:
    if d.get("format") != FORMAT or d.get("version") != VERSION:
        raise WorkloadConfigError(
            f"not a version-{VERSION} {FORMAT} document", "format")
    cfg = config_from_dict(d["config"])
    groups = {axis: GroupSet(axis, np.asarray(d["groups"][axis], dtype=np.int64).reshape(
        -1, len(d["groups"][axis][0]) if d["groups"][axis] else 1)) for axis in AXES}
    programs = [program_from_dict(p) for p in d["programs"]]
    program_of = np.asarray(d["program_of_rank"], dtype=np.int32)
    if program_of.shape != (cfg.cluster.world_size,):
        raise WorkloadConfigError("needs one entry per rank", "program_of_rank")
    _check_programs(programs)
    return Schedule(cfg, groups, programs, program_of, origin=d.get("origin"))


def _check_programs(programs: list[Program]) -> None:
    for pi, p in enumerate(programs):
        for i, op in enumerate(p.ops):
            if any(not 0 <= dep < i for dep in op.deps):
                raise WorkloadConfigError(
                    f"op {i} ({op.tag}) depends on a later or missing op",
                    f"programs[{pi}].ops.deps")


def dump(s: Schedule, path: str | Path) -> None:
    with open(path, "w") as fh:
        json.dump(to_dict(s), fh, separators=(",", ":"))


def load(path: str | Path) -> Schedule:
    """The schedule in the file at ``path``; :class:`WorkloadConfigError` names the file."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except OSError as exc:
        raise WorkloadConfigError(f"cannot read it: {exc.strerror}", "", str(path)) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"{path}:{exc.lineno}:{exc.colno}" if isinstance(
            exc, json.JSONDecodeError) else str(path)
        raise WorkloadConfigError(f"not JSON: {exc}", "", where) from exc
    try:
        return from_dict(data)
    except WorkloadConfigError as exc:
        raise WorkloadConfigError(exc.reason, exc.field, str(path)) from exc
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WorkloadConfigError(f"not a valid schedule ({type(exc).__name__}: {exc})", "",
                                  str(path)) from exc
