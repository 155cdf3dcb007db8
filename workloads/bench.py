"""Benchmark: one iteration of Llama3.1-405B on 16384 H100s (TP8+SP, PP16, FSDP128).

The split is the Llama 3 paper's 16K-GPU setup (TP 8, PP 16, DP 128, no CP), with 16
micro-batches of one 8192-token sequence. Measures generation, the op count over all ranks,
the phases of one rank per program, the modeled timeline and writing the JSON form.
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from workloads.builder import generate_schedule
from workloads.config import WorkloadConfig
from workloads.hardware import Cluster, get_gpu
from workloads.models import get_preset
from workloads.parallel import ParallelConfig
from workloads.phases import phases_of
from workloads.timing import representatives, simulate


def bench_config() -> WorkloadConfig:
    """The benchmark's workload."""
    return WorkloadConfig(
        model=get_preset("llama3.1-405b"), cluster=Cluster(2048, 8),
        parallel=ParallelConfig(tp=8, sp=True, fsdp=128, pp=16),
        seq_len=8192, micro_batch_size=1, num_microbatches=16, gpu=get_gpu("h100"), mfu=0.4)


def run_workload_bench() -> dict[str, Any]:
    """``{"gpus", "ops", "wall_s", "peak_rss_mb"}`` for one generated iteration."""
    cfg = bench_config()
    t0 = time.perf_counter()
    schedule = generate_schedule(cfg)
    ops = schedule.op_count
    for rank in representatives(schedule):
        phases_of(schedule, rank)
    iteration_s = max(end for _, end in simulate(schedule).values())
    with tempfile.TemporaryDirectory() as tmp:
        schedule.to_json(str(Path(tmp) / "schedule.json"))
        json_mb = (Path(tmp) / "schedule.json").stat().st_size / 2**20
    wall_s = time.perf_counter() - t0
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"gpus": cfg.cluster.world_size, "ops": ops, "wall_s": round(wall_s, 3),
            "peak_rss_mb": round(peak_rss_mb, 1), "modeled_iteration_s": round(iteration_s, 3),
            "json_mb": round(json_mb, 2)}


if __name__ == "__main__":
    import json

    print(json.dumps(run_workload_bench()))
