"""Collective sizes and counts per axis against hand-computed values."""

from __future__ import annotations

from collections import Counter

from wl_helpers import TINY, TINY_MOE, tiny

from workloads import Schedule
from workloads.builder import pipeline_order

T, H, A = 32, 64, 2  # tokens per micro-batch (seq 32, mbs 1), hidden, bf16 bytes


def _coll(s: Schedule, rank: int, axis: str) -> list:
    return [op for op in s.ops_of(rank) if op.is_collective and op.axis == axis]


def test_tp_without_sp_all_reduces_twice_per_layer_each_way() -> None:
    s = tiny(1, 2, tp=2, dp=1, microbatches=1)
    tp = _coll(s, 0, "tp")
    layer_ar = [op for op in tp if not op.tag.startswith("opt.")]
    assert len(layer_ar) == TINY.n_layers * 4
    assert {op.kind for op in layer_ar} == {"all_reduce"}
    assert {op.size_bytes for op in layer_ar} == {T * H * A}
    assert {op.wire_bytes for op in layer_ar} == {T * H * A}  # 2 (n-1)/n with n = 2


def test_tp_with_sp_uses_all_gather_and_reduce_scatter() -> None:
    s = tiny(1, 4, tp=4, sp=True, microbatches=1)
    c = Counter((op.kind, op.size_bytes) for op in _coll(s, 0, "tp")
                if not op.tag.startswith("opt."))
    assert c == {("all_gather", T * H * A // 4): TINY.n_layers * 4,
                 ("reduce_scatter", T * H * A): TINY.n_layers * 4}


def test_degree_one_axes_emit_no_collectives() -> None:
    s = tiny(1, 1, microbatches=2)
    assert [op for op in s.ops_of(0) if op.is_collective] == []


def test_pp_one_has_no_pipeline_traffic_and_pp_two_has_per_microbatch_sends() -> None:
    assert _coll(tiny(1, 2, dp=2), 0, "pp") == []
    s = tiny(2, 1, pp=2, microbatches=3)
    sends = [op for op in _coll(s, 0, "pp") if op.kind == "send"]
    recvs = [op for op in _coll(s, 0, "pp") if op.kind == "recv"]
    assert len(sends) == len(recvs) == 3
    assert {op.size_bytes for op in sends} == {T * H * A}
    assert {op.peer for op in sends} == {1}


def test_cp_ring_attention_sizes() -> None:
    s = tiny(1, 2, cp=2, microbatches=1)
    cp = [op for op in _coll(s, 0, "cp")]
    kv = 2 * (T // 2) * TINY.kv_dim * A  # K and V of this rank's 16 tokens
    assert Counter((op.kind, op.size_bytes) for op in cp) == {
        ("all_gather", kv): TINY.n_layers, ("reduce_scatter", 2 * kv): TINY.n_layers}


def test_fsdp_with_reshard_gathers_every_forward_and_backward() -> None:
    s = tiny(1, 2, fsdp=2, microbatches=2)  # pp = 1: reshard_after_forward defaults on
    ag = [op for op in _coll(s, 0, "fsdp") if op.kind == "all_gather"]
    rs = [op for op in _coll(s, 0, "fsdp") if op.kind == "reduce_scatter"]
    units = TINY.n_layers + 1  # blocks + root (embedding, norm, head)
    assert len(ag) == 2 * 2 * units  # 2 micro-batches x (forward + backward)
    assert len(rs) == units  # only in the last micro-batch


def test_fsdp_without_reshard_gathers_once() -> None:
    s = tiny(1, 2, fsdp=2, reshard_after_forward=False, microbatches=3)
    ag = [op for op in _coll(s, 0, "fsdp") if op.kind == "all_gather"]
    assert len(ag) == TINY.n_layers + 1


def test_fsdp_unit_sizes() -> None:
    s = tiny(1, 2, fsdp=2, fsdp_unit="stage", microbatches=1)
    ops = _coll(s, 0, "fsdp")
    params = 2 * 1000 * 64 + 6 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 128) + 64
    ag = next(op for op in ops if op.kind == "all_gather")
    rs = next(op for op in ops if op.kind == "reduce_scatter")
    assert ag.size_bytes == params // 2 * 2 and ag.wire_bytes == ag.size_bytes
    assert rs.size_bytes == params * 4 and rs.wire_bytes == params * 2


def test_hsdp_adds_a_replicate_all_reduce_of_the_shard() -> None:
    s = tiny(2, 2, dp=2, fsdp=2, fsdp_unit="stage", microbatches=1)
    rs = next(op for op in _coll(s, 0, "fsdp") if op.kind == "reduce_scatter")
    ar = next(op for op in _coll(s, 0, "dp") if op.kind == "all_reduce")
    assert ar.size_bytes == rs.size_bytes // 2 and rs.index in ar.deps


def test_ddp_buckets() -> None:
    s = tiny(1, 2, dp=2, microbatches=2)
    ar = [op for op in _coll(s, 0, "dp")]
    grads = 4 * (2 * 1000 * 64 + 6 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 128) + 64)
    assert sum(op.size_bytes for op in ar) == grads  # every fp32 gradient, once
    s2 = tiny(1, 2, dp=2, microbatches=1, seq_len=32)
    small = s2.config.__class__(**{**s2.config.__dict__, "ddp_bucket_mb": 0.25})
    from workloads import generate_schedule
    ar2 = _coll(generate_schedule(small), 0, "dp")
    assert len(ar2) == -(-grads // (2**18)) and max(op.size_bytes for op in ar2) == 2**18


def test_ep_all_to_all_with_uneven_experts() -> None:
    s = tiny(2, 2, model=TINY_MOE, fsdp=4, ep=4, microbatches=1)
    per = T * TINY_MOE.top_k * H * A  # bytes routed out of a rank per dispatch
    split = [per * e // 6 for e in (2, 2, 1, 1)]  # uniform routing, floored per peer
    # 6 experts over 4 ranks: (2, 2, 1, 1); ranks 0 and 3 run different programs
    assert int(s.program_of[0]) != int(s.program_of[3])
    d0 = next(op for op in _coll(s, 0, "ep") if op.tag.endswith("ep.dispatch"))
    c3 = next(op for op in _coll(s, 3, "ep") if op.tag.endswith("ep.combine"))
    assert d0.size_bytes == sum(split) and d0.wire_bytes == sum(split) - split[0]
    assert c3.size_bytes == 4 * split[3] and not d0.scale_up
    plan = s.step_plan(d0.collective_id)
    assert plan.sent_bytes(0) == d0.wire_bytes
    assert plan.received_bytes(3) == 3 * split[3]
    assert s.op_circuits(d0) == {0: [(0, 2)], 1: [(1, 3)]}  # all pairs, via PXN across rails
    a2a = [op for op in _coll(s, 0, "ep") if op.kind == "all_to_all"]
    assert len(a2a) == 4 * TINY_MOE.n_layers  # 2 forward + 2 backward per MoE block


def test_ep_rejected_without_uneven_program_split_when_even() -> None:
    s = tiny(1, 4, model=TINY_MOE, fsdp=4, ep=2, microbatches=1)  # 6 experts / 2: even
    assert len(s.programs) == 1


def test_one_f_one_b_order() -> None:
    assert pipeline_order(2, 0, 3, 1, "1f1b") == [
        ("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 2, 0), ("B", 1, 0), ("B", 2, 0)]
    assert pipeline_order(2, 1, 3, 1, "1f1b") == [
        ("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0), ("F", 2, 0), ("B", 2, 0)]


def test_interleaved_order_and_wraparound_sends() -> None:
    order = pipeline_order(2, 0, 2, 2, "interleaved")
    assert len(order) == 8 and order[:4] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1),
                                             ("F", 1, 1)]
    s = tiny(2, 1, pp=2, pp_schedule="interleaved", virtual_stages=2, microbatches=2)
    # stage 1 sends chunk 1's activations back to stage 0 (chunk 2)
    sends = [op for op in _coll(s, 1, "pp") if op.kind == "send" and op.tag.startswith("act")]
    assert {op.tag for op in sends} == {"act.c1.m0", "act.c1.m1"}
    assert {op.peer for op in sends} == {0}
