"""Workload generator: per-rank schedules of one training iteration.

``generate_schedule(WorkloadConfig) -> Schedule`` turns a model, its parallelism, the cluster
and a GPU preset into every rank's ops (compute and collectives with their groups, sizes and
dependencies), from which step plans, phases and rail circuits are derived. Pure Python and
numpy; it imports nothing from the emulator, the controller or the testbed.
"""

from workloads.builder import generate_schedule, split_experts, split_layers
from workloads.config import ParallelConfig, WorkloadConfig
from workloads.errors import WorkloadConfigError
from workloads.hardware import GPU_PRESETS, Cluster, GpuSpec, get_gpu
from workloads.layout import AXES, GroupSet
from workloads.loader import load_experiment_workload, parse_workload
from workloads.models import PRESETS, ModelSpec, get_preset, total_params
from workloads.phases import Phase
from workloads.schedule import Op, Program, Schedule, TemplateOp
from workloads.steps import StepPlan, Transfer

__all__ = [
    "AXES", "GPU_PRESETS", "PRESETS", "Cluster", "GpuSpec", "GroupSet", "ModelSpec", "Op",
    "ParallelConfig", "Phase", "Program", "Schedule", "StepPlan", "TemplateOp", "Transfer",
    "WorkloadConfig", "WorkloadConfigError", "generate_schedule", "get_gpu", "get_preset",
    "load_experiment_workload", "parse_workload", "split_experts", "split_layers",
    "total_params",
]
