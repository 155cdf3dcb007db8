"""What TorchTitan 0.3.0 needs to train on torch 2.13's CPU build: one pinned set of patches.

TorchTitan 0.3.0 was written against a newer torch than 2.13 and assumes CUDA. :func:`apply`
bridges exactly that pair and refuses any other (:class:`TitanVersionError` names both
versions and the pin): a patch written for one pair can silently do the wrong thing on the
next. Each patch below names the mismatch it covers; none changes what the model computes,
only where it runs and which collective forms it asks for.

1. ``triton`` (a CUDA kernel compiler) is imported at module level by the expert-parallel
   MoE kernels, which the trainer imports even for Llama. Instead of installing triton for an
   import, that one module is replaced by a stand-in whose kernels raise if ever called.
2. ``tools/utils.py`` falls back to ``"cuda"`` when torch reports no accelerator:
   ``torch._utils._get_available_device_type`` answers ``"cpu"`` instead of ``None``.
3. The device memory monitor calls ``torch.cpu.get_device_name`` and the CUDA memory-stat
   API, which ``torch.cpu`` lacks: a CPU monitor reports the machine's memory and no peaks.
4. 0.3.0's default ``parallelism.spmd_backend`` expects a newer FSDP; :data:`REQUIRED_ARGS`
   selects ``partial_dtensor`` (and turns CUDA graphs off), as configuration, not a patch.
5. The trainer calls ``schedule.step(arg_mbs=, kwarg_mbs=, target_mbs=)`` with the
   micro-batches already split; torch 2.13's pipeline schedules only take a whole batch.
   The shim runs 2.13's own ``_step_microbatches`` on the given micro-batches.
6. torch 2.13's FlexAttention refuses backward on CPU, and compiling it needs triton or a
   C++ tool chain at run time: the CPU check is lifted (the eager path has an autograd
   rule) and attention and its block mask run uncompiled.
7. FSDP divides gradients with ``ReduceOp.PREMUL_SUM``, which neither gloo nor the ``opus``
   backend carries: every FSDP group is set to sum-only reductions
   (``set_force_sum_reduction_for_comms``), the divisions done before and after.
8. ``set_pg_timeouts`` calls ``barrier(device_ids=["cpu"])`` and
   ``torch.distributed.set_timeout``, neither in torch 2.13: a barrier, then 2.13's
   ``_set_pg_timeout`` where the group's backend has timeouts (``opus`` keeps its own).

Checked, 2026-11-27: torchtitan 0.2.2 (the registry's other recent release) needs items
1-3, 7 and 8 with torch 2.13 but has an older command line (``--model.name``/``--model.flavor``
instead of 0.3.0's ``--module``/``--config`` registry); 0.3.0 is the pin.
"""

from __future__ import annotations

import importlib.metadata
import sys
import types
from collections.abc import Callable
from typing import Any

TORCHTITAN_VERSION = "0.3.0"
TORCH_SERIES = "2.13"
KERNELS_MODULE = "torchtitan.distributed.minimal_async_ep.kernels"
# configuration, not patches: item 4 (and CUDA graphs, which need CUDA)
REQUIRED_ARGS = ("--training.disable_cuda_graphs", "--parallelism.spmd_backend",
                 "partial_dtensor")

_applied: list[bool] = []


class TitanVersionError(RuntimeError):
    """The installed torchtitan or torch is not the pair these patches were written for."""


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_versions(torchtitan: str | None = None, torch: str | None = None) -> None:
    """Raise :class:`TitanVersionError` unless torchtitan is 0.3.0 and torch 2.13.x
    (by default the installed versions)."""
    titan = torchtitan if torchtitan is not None else _installed("torchtitan")
    tv = torch if torch is not None else _installed("torch")
    pin = (f"the TorchTitan workload is pinned to torchtitan=={TORCHTITAN_VERSION} with "
           f"torch {TORCH_SERIES}.x (testbed/torchjob/titan_compat.py)")
    if titan is None:
        raise TitanVersionError(f"torchtitan is not installed; {pin}: pip install "
                                f"torchtitan=={TORCHTITAN_VERSION} (or bash scripts/setup.sh)")
    if titan != TORCHTITAN_VERSION:
        raise TitanVersionError(f"torchtitan {titan} is installed; {pin}. Install "
                                f"torchtitan=={TORCHTITAN_VERSION}, or port the patches of "
                                "titan_compat.py to this version and re-pin them")
    series = ".".join((tv or "").split("+")[0].split(".")[:2])
    if series != TORCH_SERIES:
        raise TitanVersionError(f"torch {tv} is installed; {pin}. Port the patches of "
                                "titan_compat.py to this torch and re-pin them")


def apply() -> None:
    """Check the versions, then install every patch (once per process; before torchtitan's
    trainer is imported)."""
    if _applied:
        return
    check_versions()
    _stub_triton_kernels()
    _cpu_device_type()
    import torch.distributed.distributed_c10d  # noqa: F401 (before torchtitan's imports)

    _cpu_memory_monitor()
    _pipeline_step_with_microbatches()
    _flex_attention_on_cpu()
    _fsdp_sum_only()
    _pg_timeouts()
    _applied.append(True)


def _stub_triton_kernels() -> None:
    """Item 1: the MoE kernels module, without importing triton."""
    module = types.ModuleType(KERNELS_MODULE, "stand-in: triton kernels, unused by dense models")

    def missing(name: str) -> Callable[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)

        def kernel(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError(f"{KERNELS_MODULE}.{name} needs triton and CUDA (MoE expert "
                               "parallelism); the testbed's TorchTitan runs dense models")
        return kernel

    module.__getattr__ = missing  # type: ignore[method-assign]
    sys.modules.setdefault(KERNELS_MODULE, module)


def _cpu_device_type() -> None:
    """Item 2: no accelerator means the CPU, not CUDA."""
    import torch._utils

    original = torch._utils._get_available_device_type

    def device_type() -> str:
        return original() or "cpu"

    torch._utils._get_available_device_type = device_type


def _cpu_memory_monitor() -> None:
    """Item 3: a memory monitor that asks nothing of ``torch.cpu`` it lacks."""
    import psutil
    import torch
    from torchtitan.components import metrics

    class CpuMemoryMonitor(metrics.DeviceMemoryMonitor):
        def __init__(self, device: str = "cpu") -> None:
            self.device = torch.device("cpu")
            self.device_name = "cpu"
            self.device_index = 0
            self.device_capacity = psutil.virtual_memory().total
            self.device_capacity_gib = self._to_gib(self.device_capacity)

        def get_peak_stats(self) -> Any:
            return metrics.DeviceMemStats(0.0, 0.0, 0.0, 0.0, 0, 0)

        def reset_peak_stats(self) -> None:
            pass

    metrics.DeviceMemoryMonitor = CpuMemoryMonitor


def _pipeline_step_with_microbatches() -> None:
    """Item 5: ``step(arg_mbs=, kwarg_mbs=, target_mbs=)`` on torch 2.13's schedules."""
    from torch.distributed.pipelining import schedules

    def shim(original: Callable[..., Any]) -> Callable[..., Any]:
        def step(self: Any, *args: Any, arg_mbs: list[Any] | None = None,
                 kwarg_mbs: list[Any] | None = None, target_mbs: list[Any] | None = None,
                 losses: list[Any] | None = None, return_outputs: bool = True,
                 loss_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
            if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
                return original(self, *args, losses=losses, return_outputs=return_outputs,
                                loss_kwargs=loss_kwargs, **kwargs)
            # what 2.13's step() does before it splits a whole batch
            stages = getattr(self, "_stages", None) or [self._stage]
            for stage in stages:
                stage.has_backward = self._has_backward
                stage.clear_runtime_states()
            self._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs,
                                    loss_kwargs=loss_kwargs)
            return None
        return step

    for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        cls.step = shim(cls.step)


def _flex_attention_on_cpu() -> None:
    """Item 6: FlexAttention's backward on CPU, uncompiled."""
    import torch.nn.attention.flex_attention as flex
    from torchtitan.models.common import attention

    check = flex._validate_device

    def validate_device(query: Any, key: Any, value: Any) -> None:
        if query.device.type != "cpu":
            check(query, key, value)

    flex._validate_device = validate_device
    attention.FlexAttention._compiled_flex_attn = staticmethod(flex.flex_attention)
    attention._compiled_create_block_mask = flex.create_block_mask


def _fsdp_sum_only() -> None:
    """Item 7: every FSDP group reduces with SUM only (no PREMUL_SUM)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    init = _fsdp_param_group.FSDPParamGroup.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.force_sum_reduction_for_comms = True  # = set_force_sum_reduction_for_comms(True)

    _fsdp_param_group.FSDPParamGroup.__init__ = __init__


def _pg_timeouts() -> None:
    """Item 8: the trainer's barrier and timeouts after step 1, in torch 2.13's API."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torchtitan.distributed import utils

    def set_pg_timeouts(timeout: Any, parallel_dims: Any) -> None:
        dist.barrier()
        groups = [mesh.get_group()
                  for mesh in parallel_dims.get_all_one_dimensional_meshes().values()]
        for group in [*groups, None]:
            pg = group if group is not None else c10d._get_default_group()
            if pg._get_backend_name() in ("gloo", "nccl"):
                c10d._set_pg_timeout(timeout, group)

    utils.set_pg_timeouts = set_pg_timeouts
