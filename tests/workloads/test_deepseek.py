"""DeepSeek-V3 16B (TorchTitan's "16B" flavour): multi-head latent attention, its TP split,
TorchTitan's pipeline split and FSDP units without EP, against hand-computed counts and the
Opus artifact's recorded call counts (evaluation/deepseek_v3_16b-3d-16-latency/comm_pattern)."""

from __future__ import annotations

import dataclasses

import pytest
from wl_helpers import ROOT

from workloads import (
    WorkloadConfigError,
    generate_schedule,
    get_preset,
    load_experiment_workload,
    split_layers,
    total_params,
)
from workloads.models import active_params, layer_params
from workloads.schedule import config_to_dict

DS = get_preset("deepseek-v3-16b")
H = 2048
# MLA, q_lora_rank 0: wq 2048 x 16*(128+64), wkv_b 512 x 16*(128+128), wo 16*128 x 2048 per
# head (TP-sharded); wkv_a 2048 x (512+64) and the 512-wide kv_norm replicated over TP
WQ, WKV_B, WO, WKV_A = H * 16 * 192, 512 * 16 * 256, 16 * 128 * H, H * 576


def test_parameter_counts_from_the_architecture() -> None:
    dense = layer_params(DS, 0)
    assert dense.tp_sharded == WQ + WKV_B + WO + 3 * H * 10944
    assert dense.replicated == WKV_A + 512 + 2 * H
    moe = layer_params(DS, 1)
    assert moe.tp_sharded == WQ + WKV_B + WO + 2 * 3 * H * 1408  # 2 shared experts
    assert moe.replicated == WKV_A + 512 + 2 * H + H * 64  # router gate
    assert (moe.expert_each, moe.n_experts) == (3 * H * 1408, 64)
    # DeepSeek-V2-Lite: "15.7B" total, "2.4B" activated (without the embedding table)
    assert total_params(DS) == 15_706_484_224
    assert (active_params(DS) - 102400 * H) / 1e9 == pytest.approx(2.45, abs=0.01)


def test_gqa_models_are_unchanged_by_the_mla_terms() -> None:
    llama = get_preset("llama3-8b")
    assert llama.attn_matrices == (2 * 4096 * 4096 + 2 * 4096 * 1024, 0)
    assert (llama.qk_head_dim, llama.v_head_dim_eff, llama.attn_norm_params) == (128, 128, 0)


@pytest.mark.parametrize(("change", "field"), [
    ({"n_kv_heads": 8}, "n_kv_heads"),
    ({"v_head_dim": 0}, "v_head_dim"),
    ({"kv_lora_rank": 0}, "qk_rope_head_dim"),
    ({"q_lora_rank": -1}, "q_lora_rank"),
])
def test_impossible_mla_settings_are_refused(change: dict, field: str) -> None:
    with pytest.raises(WorkloadConfigError, match=field):
        dataclasses.replace(DS, **change).validate()


def test_torchtitan_layer_split() -> None:
    # generate_llm_fqn_per_model_part, input and output weight 1: 29 slots over 2 stages
    assert split_layers(27, 2, "torchtitan") == [range(0, 14), range(14, 27)]
    assert split_layers(27, 2) == [range(0, 13), range(13, 27)]
    assert [len(r) for r in split_layers(27, 4, "torchtitan")] == [7, 7, 7, 6]
    assert split_layers(32, 2, "torchtitan") == split_layers(32, 2)


def test_the_artifact_example_matches_the_recorded_call_counts() -> None:
    cfg = load_experiment_workload(ROOT / "examples" / "deepseek-v3-16b-artifact.yaml")
    assert cfg.calibrate_step_s == 13.46
    s = generate_schedule(cfg)
    for stage, units in ((0, 15), (1, 14)):  # embedding + 14 blocks | 13 blocks + head
        calls = [op for op in s.ops_of(stage * 8) if op.is_collective and not op.scale_up]
        kinds = [(op.axis, op.kind) for op in calls]
        assert "edp" not in {a for a, _ in kinds}  # no EP: experts gathered with their block
        # 3 gathering passes a step (FSDP2 under PP, "always"), one reduce-scatter a unit
        assert kinds.count(("fsdp", "all_gather")) == 3 * units
        assert kinds.count(("fsdp", "reduce_scatter")) == units
        # grad-norm all-reduce + 3 loss-logging + the MoE load balancing's tokens per expert
        assert kinds.count(("fsdp", "all_reduce")) == 1 + 4


def test_defaults_of_the_new_fields_are_not_serialised() -> None:
    plain = load_experiment_workload(ROOT / "examples" / "llama3-8b-artifact.yaml")
    d = config_to_dict(plain)
    assert "kv_lora_rank" not in d["model"] and "pp_layer_split" not in d["parallel"]
    d = config_to_dict(load_experiment_workload(ROOT / "examples"
                                                / "deepseek-v3-16b-artifact.yaml"))
    assert d["model"]["kv_lora_rank"] == 512 and d["parallel"]["pp_layer_split"] == "torchtitan"
