"""Collectives, repeated: synthetic schedules for benchmarks and tests of algorithms.

:func:`collective_schedule` gives every rank of the cluster one program: ``repeats`` times a
compute gap of ``gap_s`` and then each collective asked for, over one group of all ranks, with
the algorithms and stragglers asked for. The layout is FSDP and EP over every rank: an
all-to-all runs on the ``ep`` axis (each rank sends ``size_bytes / n`` to every member, its own
block included, as the MoE dispatch under uniform routing), the other kinds on ``fsdp``. The
model (Mixtral-8x7B, with at least one expert per rank) only names the workload: the sizes are
given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from workloads.config import Straggler, WorkloadConfig
from workloads.hardware import Cluster
from workloads.layout import build_groups
from workloads.models import get_preset
from workloads.parallel import ParallelConfig
from workloads.schedule import Program, Schedule, TemplateOp


def collective_schedule(cluster: Cluster, kind: str, size_bytes: int, *, repeats: int = 1,
                        gap_s: float = 0.0,
                        algorithms: tuple[tuple[str, str, str], ...] = (),
                        stragglers: tuple[Straggler, ...] = ()) -> Schedule:
    """One collective of ``kind`` and ``size_bytes`` per repeat (see the module docstring)."""
    return collectives_schedule(cluster, [(kind, size_bytes)], repeats=repeats, gap_s=gap_s,
                                algorithms=algorithms, stragglers=stragglers)


def collectives_schedule(cluster: Cluster, collectives: Sequence[tuple[str, int]], *,
                         repeats: int = 1, gap_s: float = 0.0,
                         algorithms: tuple[tuple[str, str, str], ...] = (),
                         stragglers: tuple[Straggler, ...] = ()) -> Schedule:
    """Each ``(kind, size_bytes)`` in turn per repeat (validated; module docstring)."""
    n = cluster.world_size
    moe = get_preset("mixtral-8x7b")
    parallel = ParallelConfig(fsdp=n, ep=n)
    cfg = WorkloadConfig(model=replace(moe, n_experts=max(moe.n_experts, n)), cluster=cluster,
                         parallel=parallel, algorithms=algorithms, stragglers=stragglers)
    cfg.validate()
    ops: list[TemplateOp] = []
    for i in range(repeats):
        ops.append(TemplateOp("compute", f"gap{i}", (len(ops) - 1,) if ops else (),
                              duration_s=gap_s))
        for kind, size in collectives:
            split = tuple(size // n for _ in range(n)) if kind == "all_to_all" else ()
            ops.append(TemplateOp(kind, f"{kind}{i}", (len(ops) - 1,),
                                  axis="ep" if kind == "all_to_all" else "fsdp",
                                  size_bytes=sum(split) if split else size, split=split))
    return Schedule(cfg, build_groups(parallel), [Program(0, 0, tuple(ops))],
                    np.zeros(n, dtype=np.int32))
