"""Workload generator: per-rank schedules of one training iteration.

``generate_schedule(WorkloadConfig) -> Schedule`` turns a model, its parallelism, the cluster
and a GPU preset into every rank's ops (compute and collectives with their groups, sizes and
dependencies), from which step plans, phases and rail circuits are derived. Pure Python and
numpy; it imports nothing from the emulator, the controller or the testbed.

The names below load on first use (PEP 562), so a process that needs one light submodule (a
rank replayer reads ``workloads.steps`` through its plan) does not import numpy and the model
builder: with 32 ranks starting at once that was ~6 CPU-seconds of start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workloads.builder import generate_schedule, split_experts
    from workloads.config import WorkloadConfig
    from workloads.errors import WorkloadConfigError
    from workloads.hardware import GPU_PRESETS, Cluster, GpuSpec, get_gpu
    from workloads.layout import AXES, GroupSet
    from workloads.loader import load_experiment_workload, parse_workload
    from workloads.models import PRESETS, ModelSpec, get_preset, total_params
    from workloads.parallel import ParallelConfig, split_layers
    from workloads.phases import Phase
    from workloads.schedule import Op, Program, Schedule, TemplateOp
    from workloads.steps import StepPlan, Transfer

_SOURCES = {
    "builder": ("generate_schedule", "split_experts"),
    "config": ("WorkloadConfig",),
    "errors": ("WorkloadConfigError",),
    "hardware": ("GPU_PRESETS", "Cluster", "GpuSpec", "get_gpu"),
    "layout": ("AXES", "GroupSet"),
    "loader": ("load_experiment_workload", "parse_workload"),
    "models": ("PRESETS", "ModelSpec", "get_preset", "total_params"),
    "parallel": ("ParallelConfig", "split_layers"),
    "phases": ("Phase",),
    "schedule": ("Op", "Program", "Schedule", "TemplateOp"),
    "steps": ("StepPlan", "Transfer"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}

__all__ = [
    "AXES", "GPU_PRESETS", "PRESETS", "Cluster", "GpuSpec", "GroupSet", "ModelSpec", "Op",
    "ParallelConfig", "Phase", "Program", "Schedule", "StepPlan", "TemplateOp", "Transfer",
    "WorkloadConfig", "WorkloadConfigError", "generate_schedule", "get_gpu", "get_preset",
    "load_experiment_workload", "parse_workload", "split_experts", "split_layers",
    "total_params",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'workloads' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"workloads.{module}"), name)
    globals()[name] = value
    return value
