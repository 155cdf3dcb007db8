"""TorchTitan-faithful workload options, checked against hand-computed counts and volumes.

The configuration is the Opus artifact's run (examples/llama3-8b-artifact.yaml): Llama3-8B,
TP4 with sequence parallelism, FSDP2, PP2 1F1B, micro-batches of 4 x 8192 tokens,
reshard-after-forward "always", full activation checkpointing, 3 loss-logging all-reduces.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest
from wl_helpers import ROOT

from workloads import (
    Cluster,
    ParallelConfig,
    Schedule,
    WorkloadConfig,
    WorkloadConfigError,
    generate_schedule,
    get_preset,
    load_experiment_workload,
    parse_workload,
)
from workloads.calibrate import find_compute_scale, modeled_step_s
from workloads.schedule import Op, from_dict, to_dict
from workloads.timing import TimingModel

# Llama3-8B: H = 4096, 32 query heads and 8 KV heads of 128, FFN 14336, 32 layers.
T = 4 * 8192  # tokens of one micro-batch
TP = 4
FLOPS_PER_S = 312e12 * 0.4  # A100 bf16 peak x MFU
ATTN_FLOPS = (2 * T * (2 * 4096 * 4096 + 2 * 4096 * 1024) + 4 * T * 8192 * 4096) // TP
MLP_FLOPS = 2 * T * 3 * 4096 * 14336 // TP
BLOCK_AG = 54_534_144  # (218,103,808 / 4 (TP) + 8,192 norm weights) / 2 (FSDP) x 2 bytes
EMBED_AG = 131_334_144  # 128,256 x 4,096 / 4 (TP) / 2 (FSDP) x 2 bytes
PP_MSG = T // TP * 4096 * 2  # sequence-parallel stage boundary: 64 MiB


def artifact(microbatches: int = 2, ac: str = "full") -> WorkloadConfig:
    return WorkloadConfig(get_preset("llama3-8b"), Cluster(4, 4),
                          ParallelConfig(tp=4, sp=True, fsdp=2, pp=2, reshard_after_forward=True),
                          seq_len=8192, micro_batch_size=4, num_microbatches=microbatches,
                          activation_checkpointing=ac, loss_logging_allreduces=3)


@pytest.fixture(scope="module")
def artifact_schedule() -> Schedule:
    return generate_schedule(artifact())


def rail_calls(s: Schedule, stage: int) -> list[Op]:
    """The rail collectives of the stage's first rank, in issue order."""
    return [op for op in s.ops_of(stage * 8) if op.is_collective and not op.scale_up]


def runs(ops: list[Op]) -> list[str]:
    """Issue order compressed to runs: ``"fsdp.all_gather*17"``."""
    out: list[list] = []
    for op in ops:
        key = f"{op.axis}.{op.kind}"
        if out and out[-1][0] == key:
            out[-1][1] += 1
        else:
            out.append([key, 1])
    return [f"{k}*{n}" for k, n in out]


# ------------------------------------------------------------------ FSDP under PP, "always"

@pytest.mark.parametrize(("microbatches", "forward_passes", "backward_passes"), [
    # 17 units a stage (embedding + 16 blocks). Stage 0 runs F0 F1 B0 B1: F0 and F1 find every
    # unit resharded (2 passes of 17 on the main thread), B0 finds them resharded by F1 (1 pass
    # in the backward), B1 finds them still gathered: 51. With 3 micro-batches, F0 F1 B0 F2 B1
    # B2: F0 and F1 gather, F2 follows B0 and finds the units gathered (then reshards them), B0
    # and B1 gather, B2 does not: 68.
    (2, 2, 1), (3, 2, 2)])
def test_stage0_gathers_only_resharded_units(microbatches: int, forward_passes: int,
                                             backward_passes: int) -> None:
    s = generate_schedule(artifact(microbatches))
    ag = Counter((op.thread, op.size_bytes) for op in rail_calls(s, 0)
                 if op.kind == "all_gather")
    assert ag == {("main", BLOCK_AG): 16 * forward_passes, ("main", EMBED_AG): forward_passes,
                  ("autograd", BLOCK_AG): 16 * backward_passes,
                  ("autograd", EMBED_AG): backward_passes}
    assert sum(ag.values()) == 17 * (forward_passes + backward_passes)
    # one reduce-scatter per unit and step, of its fp32 gradient (4 x the bf16 shard x 2)
    rs = Counter(op.size_bytes for op in rail_calls(s, 0) if op.kind == "reduce_scatter")
    assert rs == {218_136_576: 16, 525_336_576: 1}
    assert (4 * BLOCK_AG, 4 * EMBED_AG) == (218_136_576, 525_336_576)


@pytest.mark.parametrize(("microbatches", "total"), [(2, 51), (3, 68)])
def test_stage1_gathers_in_its_first_forward_and_every_backward(microbatches: int,
                                                                 total: int) -> None:
    # stage 1 runs F0 B0 F1 B1 (F0 B0 F1 B1 F2 B2): F0 gathers; each backward follows a
    # forward that resharded; the later forwards follow a backward that kept the units
    s = generate_schedule(artifact(microbatches))
    ag = [op for op in rail_calls(s, 1) if op.kind == "all_gather"]
    assert len(ag) == total
    assert sum(op.thread == "autograd" for op in ag) == 17 * microbatches
    # [norm, output]: 525,336,576 / 4 (TP) + 4,096 norm = 131,338,240 params / 2 x 2 bytes
    assert Counter(op.size_bytes for op in ag) == {BLOCK_AG: 16 * (microbatches + 1),
                                                   131_338_240: microbatches + 1}
    assert sum(op.kind == "reduce_scatter" for op in rail_calls(s, 1)) == 17


def test_main_thread_issue_order_is_the_artifacts_pattern(artifact_schedule: Schedule) -> None:
    # the artifact's comm_pattern files (main thread only, per step): stage 0 "F0 AG x17 |
    # send | F1 AG x17 | send, recv, recv | RS x17 + norm AR | PP norm AR | loss ARs x3"
    def main_runs(stage: int) -> list[str]:
        return runs([op for op in rail_calls(artifact_schedule, stage) if op.thread == "main"])

    tail = ["fsdp.reduce_scatter*17", "fsdp.all_reduce*1", "pp.all_reduce*1",
            "fsdp.all_reduce*3"]
    assert main_runs(0) == ["fsdp.all_gather*17", "pp.send*1", "fsdp.all_gather*17",
                            "pp.send*1", "pp.recv*2", *tail]
    assert main_runs(1) == ["pp.recv*1", "fsdp.all_gather*17", "pp.send*1", "pp.recv*1",
                            "pp.send*1", *tail]
    for stage in (0, 1):
        calls = rail_calls(artifact_schedule, stage)
        last_p2p = max(op.index for op in calls if op.kind in ("send", "recv"))
        rs = [op for op in calls if op.kind == "reduce_scatter"]
        assert min(op.index for op in rs) > last_p2p  # reduced after the stage's last action
        # module order (FSDP2's state list, which perform_reduce_grad walks): the embedding
        # first on stage 0, [norm, output] last on stage 1
        tags = [op.tag.removeprefix(f"step.c{stage}.").removesuffix(".fsdp.rs") for op in rs]
        blocks = [f"l{k}" for k in range(16 * stage, 16 * stage + 16)]
        assert tags == ([f"c{stage}.root", *blocks] if stage == 0 else [*blocks, "c1.root"])


def test_p2p_and_the_step_end_all_reduces(artifact_schedule: Schedule) -> None:
    for stage in (0, 1):
        calls = rail_calls(artifact_schedule, stage)
        assert Counter((op.kind, op.size_bytes) for op in calls if op.axis == "pp") == {
            ("send", PP_MSG): 2, ("recv", PP_MSG): 2, ("all_reduce", 4): 1}
        ar = [op for op in calls if op.kind == "all_reduce"]
        # grad norm on FSDP and PP, then loss mean (fp32), loss max (fp32), tokens (int64)
        assert [(op.axis, op.size_bytes) for op in ar] == [
            ("fsdp", 4), ("pp", 4), ("fsdp", 4), ("fsdp", 4), ("fsdp", 8)]
        chain = [op for op in artifact_schedule.ops_of(stage * 8) if op.kind == "all_reduce"]
        assert [op.axis for op in chain] == ["fsdp", "tp", "pp", "fsdp", "fsdp", "fsdp"]
        assert all(chain[k].index in chain[k + 1].deps for k in range(len(chain) - 1))


def test_a_fourth_logging_all_reduce_is_8_bytes_and_none_without_a_dp_group() -> None:
    s = generate_schedule(dataclasses.replace(artifact(), loss_logging_allreduces=4))
    assert [op.size_bytes for op in s.ops_of(0) if op.tag.startswith("log.")] == [4, 4, 8, 8]
    solo = WorkloadConfig(get_preset("llama3-8b"), Cluster(1, 4), ParallelConfig(tp=4),
                          num_microbatches=1, loss_logging_allreduces=3)
    assert not [op for op in generate_schedule(solo).ops_of(0) if op.tag.startswith("log.")]


# ------------------------------------------------------------ full activation checkpointing

def test_recompute_adds_each_blocks_forward_compute(artifact_schedule: Schedule) -> None:
    # per block and micro-batch: attention 1,786,706,395,136 + MLP 2,886,218,022,912 =
    # 4,672,924,418,048 FLOPs per TP rank, at 312 TFLOP/s x 0.4 = 37.44 ms
    assert (ATTN_FLOPS, MLP_FLOPS) == (1_786_706_395_136, 2_886_218_022_912)
    ops = artifact_schedule.ops_of(0)
    for mb in (0, 1):
        for layer in (0, 7, 15):
            rc = [op for op in ops if op.tag.startswith(f"b.m{mb}.c0.l{layer}.rc.")]
            compute = sum(op.duration_s for op in rc if op.kind == "compute")
            assert compute == pytest.approx((ATTN_FLOPS + MLP_FLOPS) / FLOPS_PER_S, rel=1e-12)
            # its TP collectives, as in the forward with SP: all-gather of the T/tp shard
            # before attention and MLP, reduce-scatter of T x H after each, all on NVLink
            assert Counter((op.kind, op.size_bytes, op.scale_up) for op in rc
                           if op.is_collective) == {("all_gather", PP_MSG, True): 2,
                                                    ("reduce_scatter", 4 * PP_MSG, True): 2}
            fwd = sum(op.duration_s for op in ops if op.tag.startswith(f"f.m{mb}.c0.l{layer}.")
                      and op.kind == "compute")
            assert compute == pytest.approx(fwd, rel=1e-12)


def test_recompute_runs_after_the_blocks_gather_and_before_its_backward(
        artifact_schedule: Schedule) -> None:
    ops = artifact_schedule.ops_of(0)
    idx = {op.tag: op.index for op in ops}
    rc_attn = ops[idx["b.m0.c0.l15.rc.attn"]]
    assert idx["b.m0.c0.l15.fsdp.ag"] in rc_attn.deps  # FSDP's pre-backward gather
    assert idx["b.m0.c0.l15.rc.tp.mlp_out"] < idx["b.m0.c0.l15.mlp"]


def test_head_and_embedding_are_not_recomputed_and_totals_add_up() -> None:
    with_ac, without = generate_schedule(artifact()), generate_schedule(artifact(ac="none"))
    for stage in (0, 1):
        rank = stage * 8
        assert not [op for op in with_ac.ops_of(rank) if ".rc." in op.tag and "head" in op.tag]
        extra = (sum(op.duration_s for op in with_ac.ops_of(rank) if op.kind == "compute")
                 - sum(op.duration_s for op in without.ops_of(rank) if op.kind == "compute"))
        # 16 blocks a stage x 2 micro-batches x one forward each
        assert extra == pytest.approx(16 * 2 * (ATTN_FLOPS + MLP_FLOPS) / FLOPS_PER_S,
                                      rel=1e-9)
        tp_extra = Counter(op.kind for op in with_ac.ops_of(rank) if op.axis == "tp") - Counter(
            op.kind for op in without.ops_of(rank) if op.axis == "tp")
        assert tp_extra == {"all_gather": 16 * 2 * 2, "reduce_scatter": 16 * 2 * 2}


# ------------------------------------------------------- existing configs stay byte-identical

#: SHA-256 of each example's serialised schedule on main before these options existed.
MAIN_DIGESTS = {
    # demo.yaml re-pinned when the demo moved to 8192-token sequences (its only change)
    "demo.yaml": "ffaaea434f5b9c748885c3a863f90dec4b0e9e7503f15f5f47bbe9d503727f5d",
    "llama3-8b-workload.yaml":
        "c2a7065cfefc9fe6d03ad7bda7804354bcc10ba74cfa623d716bf71bb9d799bb",
    "llama3-8b.yaml": "c2a7065cfefc9fe6d03ad7bda7804354bcc10ba74cfa623d716bf71bb9d799bb",
    "tiny.yaml": "fa15dce18dddd5d628c646605727bf701b956cf4ca3928cc57eabbbcd828e993",
    "models/tiny-moe-workload.yaml":
        "84a8c94480c1df310cf9dc8d1f0fabaa940d7eeb0adbd42eb403707ac8ddf327",
}


def _digest(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(MAIN_DIGESTS))
def test_existing_examples_serialise_as_before(name: str) -> None:
    path = ROOT / "examples" / name
    doc = to_dict(generate_schedule(load_experiment_workload(path)))
    text = path.read_text().replace("workload:\n", "workload:\n  activation_checkpointing: none\n")
    explicit = to_dict(generate_schedule(parse_workload(text, str(path), path.parent)))
    assert explicit == doc
    if name.startswith("models/"):
        # PP 1 with FSDP: the backward all-gathers are now marked as the autograd thread's;
        # nothing else changed
        threads = [p["ops"].pop("thread") for p in doc["programs"]]
        assert {t for col in threads for t in col} == {"main", "autograd"}
    assert _digest(doc) == MAIN_DIGESTS[name]


def test_the_example_list_is_complete() -> None:
    listed = {str(p.relative_to(ROOT / "examples")) for p in (ROOT / "examples").glob("*.yaml")}
    newer = {"llama3-8b-artifact.yaml", "llama3-8b-artifact-scaled.yaml", "failover.yaml",
             "llama3-8b-artifact-64.yaml", "deepseek-v3-16b-artifact.yaml",
             "failover-16.yaml", "emulator-32.yaml", "emulator-64.yaml",
             "emulator-128.yaml", "deepseek-v3-16b-ep4.yaml"}  # added since
    assert listed - newer <= set(MAIN_DIGESTS)


def test_new_fields_round_trip_through_json(artifact_schedule: Schedule) -> None:
    doc = to_dict(artifact_schedule)
    assert doc["config"]["activation_checkpointing"] == "full"
    assert "thread" in doc["programs"][0]["ops"]
    assert from_dict(json.loads(json.dumps(doc))) == artifact_schedule
    doc["programs"][0]["ops"]["thread"][0] = "worker"
    with pytest.raises(WorkloadConfigError, match=r"unknown threads \['worker'\]"):
        from_dict(doc)


# ---------------------------------------------------------------------------- calibration

def test_calibration_hits_the_target_and_is_a_no_op_without_one() -> None:
    cfg = load_experiment_workload(ROOT / "examples" / "llama3-8b-artifact.yaml",
                                   TimingModel())
    assert cfg.calibrate_step_s == 10.18 and cfg.compute_scale != 1.0
    assert modeled_step_s(generate_schedule(cfg), TimingModel()) == pytest.approx(10.18,
                                                                                  rel=1e-6)
    plain = load_experiment_workload(ROOT / "examples" / "llama3-8b.yaml", TimingModel())
    assert plain.compute_scale == 1.0
    assert generate_schedule(plain) == generate_schedule(
        load_experiment_workload(ROOT / "examples" / "llama3-8b.yaml"))


def test_compute_scale_multiplies_every_compute_and_nothing_else() -> None:
    base = generate_schedule(artifact())
    scaled = generate_schedule(dataclasses.replace(artifact(), compute_scale=2.0))
    for a, b in zip(base.programs[0].ops, scaled.programs[0].ops, strict=True):
        assert b.duration_s == a.duration_s * 2.0
        assert dataclasses.replace(b, duration_s=a.duration_s) == a


def test_a_target_below_the_communication_is_refused_naming_it() -> None:
    found = find_compute_scale(artifact(), 10.18)
    assert 0 < found.communication_s < 10.18
    with pytest.raises(WorkloadConfigError) as info:
        find_compute_scale(artifact(), found.communication_s * 0.99)
    assert info.value.field == "workload.calibrate_step_s"
    assert f"communication alone takes {found.communication_s:.4g} s" in info.value.reason


# ---------------------------------------------------------------------- the experiment file

GOOD = """\
cluster: {servers: 4, gpus_per_server: 4}
workload:
  model: llama3-8b
  num_microbatches: 2
  parallelism: {tp: 4, fsdp: 2, pp: 2, reshard_after_forward: always}
"""


@pytest.mark.parametrize(("value", "expected"), [
    ("default", None), ("always", True), ("never", False), ("true", True), ("false", False)])
def test_reshard_after_forward_takes_torchtitans_names(value: str, expected: bool | None
                                                       ) -> None:
    cfg = parse_workload(GOOD.replace("always", value))
    assert cfg.parallel.reshard_after_forward is expected


@pytest.mark.parametrize(("line", "position", "message"), [
    ("  activation_checkpointing: selective\n", "exp.yaml:6:29",
     "workload.activation_checkpointing: must be one of none, full, got 'selective'"),
    ("  calibrate_step_s: 0\n", "exp.yaml:6:21", "workload.calibrate_step_s: must be > 0 s"),
    ("  calibrate_step_s: -3.5\n", "exp.yaml:6:21", "workload.calibrate_step_s: must be > 0 s"),
    ("  calibrate_step_s: fast\n", "exp.yaml:6:21", "workload.calibrate_step_s: must be a number"),
    ("  loss_logging_allreduces: -1\n", "exp.yaml:6:28",
     "workload.loss_logging_allreduces: must be an integer >= 0"),
])
def test_bad_new_keys_are_refused_at_their_position(line: str, position: str,
                                                    message: str) -> None:
    with pytest.raises(WorkloadConfigError) as info:
        parse_workload(GOOD + line, "exp.yaml")
    assert str(info.value).startswith(f"{position}: {message}")


def test_bad_reshard_name_is_refused_at_its_position() -> None:
    with pytest.raises(WorkloadConfigError) as info:
        parse_workload(GOOD.replace("always", "sometimes"), "exp.yaml")
    assert str(info.value).startswith(
        "exp.yaml:5:63: workload.parallelism.reshard_after_forward: must be one of default, "
        "always, never (or true/false), got 'sometimes'")


def test_an_unreachable_target_is_refused_at_its_position(tmp_path: Path) -> None:
    text = GOOD + "  calibrate_step_s: 0.001\n"
    assert parse_workload(text, "exp.yaml").calibrate_step_s == 0.001  # not calibrated here
    with pytest.raises(WorkloadConfigError) as info:
        parse_workload(text, "exp.yaml", timing=TimingModel())
    assert str(info.value).startswith("exp.yaml:6:21: workload.calibrate_step_s: 0.001 s "
                                      "cannot be reached: the step's communication alone takes")
