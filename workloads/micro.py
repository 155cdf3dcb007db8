"""One collective, repeated: synthetic schedules for benchmarks and tests of algorithms.

:func:`collective_schedule` gives every rank of the cluster one program: ``repeats`` times a
compute gap of ``gap_s`` and then the collective over one group of all ranks, with the
algorithms and stragglers asked for. An all-to-all runs on the ``ep`` axis (an EP group of
every rank, each sending ``size_bytes / n`` to every member, its own block included, as the
MoE dispatch under uniform routing); other kinds run on ``dp``. The model only names the
workload (Mixtral-8x7B for all-to-all, Llama3-8B otherwise): the sizes are given.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from workloads.config import ParallelConfig, Straggler, WorkloadConfig
from workloads.hardware import Cluster
from workloads.layout import build_groups
from workloads.models import get_preset
from workloads.schedule import Program, Schedule, TemplateOp


def collective_schedule(cluster: Cluster, kind: str, size_bytes: int, *, repeats: int = 1,
                        gap_s: float = 0.0,
                        algorithms: tuple[tuple[str, str, str], ...] = (),
                        stragglers: tuple[Straggler, ...] = ()) -> Schedule:
    """The schedule described in the module docstring (validated)."""
    n = cluster.world_size
    if kind == "all_to_all":
        moe = get_preset("mixtral-8x7b")
        model = replace(moe, n_experts=max(moe.n_experts, n))
        parallel, axis = ParallelConfig(fsdp=n, ep=n), "ep"
        split = tuple(size_bytes // n for _ in range(n))
        size_bytes = sum(split)
    else:
        model, parallel, axis, split = get_preset("llama3-8b"), ParallelConfig(dp=n), "dp", ()
    cfg = WorkloadConfig(model=model, cluster=cluster, parallel=parallel,
                         algorithms=algorithms, stragglers=stragglers)
    cfg.validate()
    ops: list[TemplateOp] = []
    for i in range(repeats):
        ops.append(TemplateOp("compute", f"gap{i}", (len(ops) - 1,) if ops else (),
                              duration_s=gap_s))
        ops.append(TemplateOp(kind, f"{kind}{i}", (len(ops) - 1,), axis=axis,
                              size_bytes=size_bytes, split=split))
    return Schedule(cfg, build_groups(parallel), [Program(0, 0, tuple(ops))],
                    np.zeros(n, dtype=np.int32))
