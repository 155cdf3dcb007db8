"""GPU presets and the cluster's rank placement.

Placement (TorchTitan and Megatron-LM both put TP innermost): rank ``r`` lives on server
``r // gpus_per_server`` at local index ``r % gpus_per_server``, and the local index is the
rail: a rail connects the GPUs with the same local index across servers (rails =
``gpus_per_server``).
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.errors import WorkloadConfigError


@dataclass(frozen=True)
class GpuSpec:
    """Peak dense bf16 throughput and scale-up (NVLink) bandwidth per GPU, per direction."""

    name: str
    peak_bf16_tflops: float
    scale_up_gbps: float


# Vendor datasheets, dense (no sparsity) bf16 tensor-core peaks; NVLink bandwidth per direction.
GPU_PRESETS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("a100", 312.0, 2400.0),  # NVLink 3: 300 GB/s per direction
        GpuSpec("h100", 989.0, 3600.0),  # NVLink 4: 450 GB/s
        GpuSpec("h200", 989.0, 3600.0),
        GpuSpec("b200", 2250.0, 7200.0),  # NVLink 5: 900 GB/s
    )
}


def get_gpu(name: str) -> GpuSpec:
    """The GPU preset called ``name`` (case-insensitive)."""
    key = name.lower()
    if key not in GPU_PRESETS:
        raise WorkloadConfigError(
            f"unknown GPU preset {name!r}; known: {', '.join(sorted(GPU_PRESETS))}",
            "workload.gpu")
    return GPU_PRESETS[key]


@dataclass(frozen=True)
class Cluster:
    """``servers`` scale-up domains of ``gpus_per_server`` GPUs, one rail per local index."""

    servers: int
    gpus_per_server: int

    @property
    def world_size(self) -> int:
        return self.servers * self.gpus_per_server

    @property
    def rails(self) -> int:
        return self.gpus_per_server

    def server_of(self, rank: int) -> int:
        """Scale-up domain of ``rank``."""
        return rank // self.gpus_per_server

    def rail_of(self, rank: int) -> int:
        """Rail (local index) of ``rank``."""
        return rank % self.gpus_per_server
