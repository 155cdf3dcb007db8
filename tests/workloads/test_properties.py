"""Property tests over random small configurations (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from wl_helpers import TINY, TINY_MOE

from workloads import (
    AXES,
    Cluster,
    ParallelConfig,
    Schedule,
    WorkloadConfig,
    generate_schedule,
)
from workloads.timing import simulate


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    tp = draw(st.sampled_from([1, 2]))
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2]))
    fsdp = draw(st.sampled_from([1, 2, 3]))
    pp = draw(st.sampled_from([1, 2, 3]))
    moe = draw(st.booleans())
    ep = draw(st.sampled_from([e for e in (1, 2, 3, 4) if (dp * fsdp) % e == 0])) if moe else 1
    interleaved = pp > 1 and draw(st.booleans())
    mb = pp * draw(st.integers(1, 2)) if interleaved else draw(st.integers(1, 4))
    world = tp * cp * dp * fsdp * pp
    gps = tp * draw(st.sampled_from([k for k in (1, 2, 3) if world % (tp * k) == 0]))
    par = ParallelConfig(tp=tp, sp=draw(st.booleans()), dp=dp, fsdp=fsdp, pp=pp, cp=cp, ep=ep,
                         pp_schedule="interleaved" if interleaved else "1f1b",
                         virtual_stages=2 if interleaved else 1,
                         fsdp_unit=draw(st.sampled_from(["block", "block-root", "stage"])),
                         reshard_after_forward=draw(st.sampled_from([None, True, False])))
    cfg = WorkloadConfig(TINY_MOE if moe else TINY, Cluster(world // gps, gps), par,
                         seq_len=24, num_microbatches=mb)
    return generate_schedule(cfg)


SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(schedules())
def test_groups_of_each_axis_partition_the_ranks(s: Schedule) -> None:
    for axis in AXES:
        flat = np.sort(s.groups[axis].ranks.reshape(-1))
        assert np.array_equal(flat, np.arange(s.world_size)), axis


@SETTINGS
@given(schedules())
def test_every_send_has_its_matching_recv(s: Schedule) -> None:
    for rank in range(s.world_size):
        for op in s.ops_of(rank):
            if op.kind not in ("send", "recv"):
                continue
            members = s.collective_members(op.collective_id)
            assert sorted(m.kind for m in members) == ["recv", "send"]
            send = next(m for m in members if m.kind == "send")
            recv = next(m for m in members if m.kind == "recv")
            assert send.peer == recv.rank and recv.peer == send.rank
            assert send.size_bytes == recv.size_bytes


@SETTINGS
@given(schedules())
def test_dag_is_acyclic_and_replays_without_deadlock(s: Schedule) -> None:
    for prog in s.programs:
        assert all(all(0 <= d < i for d in op.deps) for i, op in enumerate(prog.ops))
    times = simulate(s)  # raises DeadlockError if rendezvous and deps form a cycle
    assert all(end >= start for start, end in times.values())


@SETTINGS
@given(schedules())
def test_collective_members_agree_and_plans_match_wire_bytes(s: Schedule) -> None:
    rank = s.world_size - 1
    seen: set[str] = set()
    for op in s.ops_of(rank):
        if not op.is_collective or op.collective_id in seen:
            continue
        seen.add(op.collective_id)
        members = s.collective_members(op.collective_id)
        if op.kind not in ("send", "recv"):
            assert [m.rank for m in members] == list(s.group_ranks(op.group_id))
            assert len({m.kind for m in members}) == 1
        plan = s.step_plan(op.collective_id)
        for m in members:
            assert plan.sent_bytes(m.rank) == m.wire_bytes
