"""The paper's Llama3-8B volumes per call (TP4 FSDP2 PP2 on 4 x 4 A100, 1F1B, seq 8192).

DP all-gather 957 MB, DP reduce-scatter 3829 MB, PP send/recv 64 MB, sync all-reduce < 1 MB:
957 MiB is one stage's parameters / TP4 / FSDP2 in bf16, 3829 MiB the stage's parameters / TP4
in fp32, 64 MiB = 1 x 8192 x 4096 x 2 bytes.
"""

from __future__ import annotations

from wl_helpers import MIB

from workloads import Schedule
from workloads.phases import phases_of


def _rail_collectives(s: Schedule, rank: int, kind: str, axis: str) -> list[int]:
    return [op.size_bytes for op in s.ops_of(rank)
            if op.kind == kind and op.family == axis and not op.scale_up]


def test_dp_all_gather_per_call_is_957_mib(paper_schedule: Schedule) -> None:
    for rank in (0, 8):  # both pipeline stages
        (size,) = _rail_collectives(paper_schedule, rank, "all_gather", "dp")
        assert int(size / MIB) == 957  # 957.38 MiB: the paper's 957 MB truncated
        assert abs(size / MIB - 957) / 957 < 0.001


def test_dp_reduce_scatter_per_call_is_3829_mib(paper_schedule: Schedule) -> None:
    for rank in (0, 8):
        (size,) = _rail_collectives(paper_schedule, rank, "reduce_scatter", "dp")
        assert int(size / MIB) == 3829  # 3829.50 / 3829.52 MiB
        assert abs(size / MIB - 3829) / 3829 < 0.001


def test_stage0_sizes_exactly(paper_schedule: Schedule) -> None:
    # per-TP-rank parameters: 4,014,997,504 / 4 sharded + 131,072 replicated norm weights
    local = 4_014_997_504 // 4 + 131_072
    (ag,) = _rail_collectives(paper_schedule, 0, "all_gather", "dp")
    (rs,) = _rail_collectives(paper_schedule, 0, "reduce_scatter", "dp")
    assert ag == local // 2 * 2 and rs == local * 4


def test_pp_send_recv_is_64_mib(paper_schedule: Schedule) -> None:
    sizes = _rail_collectives(paper_schedule, 0, "send", "pp") + \
        _rail_collectives(paper_schedule, 0, "recv", "pp")
    assert len(sizes) == 16  # 8 activations out, 8 gradients in
    assert set(sizes) == {1 * 8192 * 4096 * 2} == {64 * MIB}


def test_sync_all_reduces_are_below_1_mib(paper_schedule: Schedule) -> None:
    ar = [op for op in paper_schedule.ops_of(0) if op.kind == "all_reduce" and not op.scale_up]
    assert ar and all(op.size_bytes < MIB for op in ar)
    assert {op.tag for op in ar} == {"opt.gradnorm.fsdp", "opt.gradnorm.pp"}


def test_rank0_phase_sequence(paper_schedule: Schedule) -> None:
    phases = [(p.axis, p.kind) for p in phases_of(paper_schedule, 0)]
    assert phases == [("dp", "allgather"), ("pp", "sendrecv"), ("dp", "reducescatter"),
                      ("dp", "allreduce"), ("pp", "allreduce")]


def test_block_units_sum_to_the_same_phases(paper_schedule_blocks: Schedule) -> None:
    # one unit per transformer block plus the root: 17 calls whose phase totals match
    ph = {(p.axis, p.kind): p for p in phases_of(paper_schedule_blocks, 0)}
    ag, rs = ph[("dp", "allgather")], ph[("dp", "reducescatter")]
    assert len(ag.op_indices) == len(rs.op_indices) == 17
    assert int(ag.message_bytes / MIB) == 957 and int(rs.message_bytes / MIB) == 3829


def test_dp_and_pp_circuits_of_rank0(paper_schedule: Schedule) -> None:
    ph = phases_of(paper_schedule, 0)
    assert ph[0].group_ids == ["fsdp0"] and ph[0].circuits == {0: [(0, 4)]}
    assert ph[1].group_ids == ["pp0"] and ph[1].circuits == {0: [(0, 8)]}


def test_tp_collectives_stay_inside_the_server(paper_schedule: Schedule) -> None:
    tp = [op for op in paper_schedule.ops_of(5) if op.axis == "tp"]
    assert tp and all(op.scale_up for op in tp)
    assert all(paper_schedule.op_circuits(op) == {} for op in tp)


def test_first_stage1_all_gather_waits_for_the_activation(paper_schedule: Schedule) -> None:
    ops = paper_schedule.ops_of(8)
    ag = next(op for op in ops if op.kind == "all_gather" and op.family == "dp")
    first_recv = next(op for op in ops if op.kind == "recv")
    assert first_recv.index in ag.deps


def test_reduce_scatter_follows_the_last_backward(paper_schedule: Schedule) -> None:
    ops = paper_schedule.ops_of(0)
    rs = next(op for op in ops if op.kind == "reduce_scatter")
    last_bwd = max(op.index for op in ops if op.kind == "compute" and op.tag.startswith("b.m7"))
    assert last_bwd in _ancestors(ops, rs.index)
    assert all(op.index < rs.index for op in ops
               if op.kind == "compute" and op.tag.startswith("b."))
    # and FSDP collectives are serialised on their communicator
    ag = next(op for op in ops if op.kind == "all_gather" and op.axis == "fsdp")
    assert ag.index in rs.deps


def _ancestors(ops: list, index: int) -> set[int]:
    seen: set[int] = set()
    todo = list(ops[index].deps)
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            todo.extend(ops[i].deps)
    return seen
