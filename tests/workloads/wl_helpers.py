"""Shared builders for the workload tests (imported as a top-level module by pytest)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the package is importable from a checkout without install
    sys.path.insert(0, str(ROOT))

from workloads import (  # noqa: E402
    Cluster,
    ModelSpec,
    ParallelConfig,
    Schedule,
    WorkloadConfig,
    generate_schedule,
    get_preset,
)

MIB = 2**20
TINY = ModelSpec("tiny", vocab_size=1000, hidden_size=64, n_layers=6, n_heads=4, n_kv_heads=2,
                 ffn_hidden_size=128)
TINY_MOE = ModelSpec("tiny-moe", vocab_size=1000, hidden_size=64, n_layers=6, n_heads=4,
                     n_kv_heads=2, ffn_hidden_size=128, n_experts=6, top_k=2,
                     moe_ffn_hidden_size=32)


def paper_config(fsdp_unit: str = "stage", microbatches: int = 8) -> WorkloadConfig:
    """Llama3-8B, TP4, FSDP2, PP2 on 4 x 4 A100, 1F1B, seq 8192, micro-batch 1."""
    return WorkloadConfig(get_preset("llama3-8b"), Cluster(4, 4),
                          ParallelConfig(tp=4, fsdp=2, pp=2, fsdp_unit=fsdp_unit),
                          seq_len=8192, micro_batch_size=1, num_microbatches=microbatches)


def tiny(servers: int, gps: int, model: ModelSpec = TINY, microbatches: int = 2,
         seq_len: int = 32, **par: object) -> Schedule:
    cfg = WorkloadConfig(model, Cluster(servers, gps), ParallelConfig(**par),  # type: ignore[arg-type]
                         seq_len=seq_len, micro_batch_size=1, num_microbatches=microbatches)
    return generate_schedule(cfg)
