"""Observed calls -> schedule (workloads.captured): groups, ops and deps, tags, refusals."""

from __future__ import annotations

import dataclasses

import pytest

from workloads.captured import Call, CaptureError, RankRun, axis_of_desc, schedule_from_runs
from workloads.schedule import Schedule, from_dict, to_dict

PP = {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}
FSDP = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}


def ag(rank: int, t: float, wait: tuple[float, float] | None = None, size: int = 1000) -> Call:
    return Call("all_gather", "fsdp", FSDP[rank], size, t, wait=wait, source=f"r{rank} ag@{t}")


def rs(rank: int, size: int) -> Call:
    return Call("reduce_scatter", "fsdp", FSDP[rank], size, 1.0, source=f"r{rank} rs")


def p2p(rank: int, t: float, wait: tuple[float, float] | None = None) -> Call:
    peer = PP[rank][1] if rank < 2 else PP[rank][0]
    kind = "send" if rank < 2 else "recv"
    return Call(kind, "pp", PP[rank], 64, t, peer=peer, wait=wait, source=f"r{rank} {kind}@{t}")


def two_by_two(**overrides: list[Call]) -> dict[int, RankRun]:
    """FSDP 2 x PP 2: every rank all-gathers (waited for), then stage 0 sends to stage 1."""
    calls = {r: [ag(r, 1.0, (2.0, 2.5)), p2p(r, 3.0)] for r in range(4)}
    for key, value in overrides.items():
        calls[int(key[1:])] = value
    return {r: RankRun(r, c, 0.0, 4.0) for r, c in calls.items()}


def build(runs: dict[int, RankRun], gps: int = 1) -> Schedule:
    return schedule_from_runs(runs, gpus_per_server=gps, origin={"kind": "test"})


def test_groups_and_degrees_come_from_the_members() -> None:
    s = build(two_by_two())
    assert s.groups["pp"].ranks.tolist() == [[0, 2], [1, 3]]
    assert s.groups["fsdp"].ranks.tolist() == [[0, 1], [2, 3]]
    assert s.groups["tp"].ranks.tolist() == [[0], [1], [2], [3]]  # unused axis: singletons
    p = s.config.parallel
    assert (p.pp, p.fsdp, p.dp, p.tp) == (2, 2, 1, 1)
    assert s.config.model is None and s.cluster.servers == 4


def test_ops_follow_the_main_thread_timeline() -> None:
    ops = build(two_by_two()).ops_of(0)
    assert [(o.kind, o.deps, round(o.duration_s, 6)) for o in ops] == [
        ("compute", (), 1.0),          # t 0 -> 1: until the all-gather's issue
        ("all_gather", (0,), 0.0),     # depends on the compute before its issue
        ("compute", (0,), 1.0),        # t 1 -> 2: then the thread waits for the all-gather
        ("compute", (1, 2), 0.5),      # t 2.5 -> 3, after the wait: depends on the waited call
        ("send", (3,), 0.0),
        ("compute", (3,), 1.0),        # t 3 -> 4: the send was never waited for
    ]


def test_tags_are_shared_by_the_members_of_each_call() -> None:
    s = build(two_by_two())
    assert [o.tag for o in s.ops_of(0) if o.is_collective] == ["fsdp0.c0", "pp.0>2.0"]
    assert [o.tag for o in s.ops_of(2) if o.is_collective] == ["fsdp1.c0", "pp.0>2.0"]
    send = next(o for o in s.ops_of(0) if o.kind == "send")
    assert send.peer == 2 and send.collective_id == "pp0:pp.0>2.0"
    assert {m.rank for m in s.collective_members(send.collective_id)} == {0, 2}
    assert [m.rank for m in s.collective_members("fsdp1:fsdp1.c0")] == [2, 3]


def test_equal_programs_are_shared_and_json_keeps_the_origin() -> None:
    runs = {r: RankRun(r, [Call("all_reduce", "dp", (0, 1), 8, 1.0)], 0.0, 2.0) for r in (0, 1)}
    s = build(runs)
    assert len(s.programs) == 1 and s.program_of.tolist() == [0, 0]
    d = to_dict(s)
    assert d["origin"] == {"kind": "test"} and d["config"]["model"] is None
    again = from_dict(d)
    assert again == s and again.origin == {"kind": "test"}


def test_axis_of_torch_descriptors() -> None:
    assert axis_of_desc("mesh_pp") == "pp" and axis_of_desc("mesh_shard") == "fsdp"
    assert axis_of_desc("mesh_replicate") == "dp" and axis_of_desc("default_pg") is None
    assert axis_of_desc("custom", {"custom": "tp"}) == "tp"


@pytest.mark.parametrize(("runs", "words"), [
    (two_by_two(r1=[p2p(1, 3.0)]),
     ["r0 ag@1.0: fsdp0: rank 0 has 1 calls", "rank 1 has 0", "all_gather of 1000 B"]),
    (two_by_two(r0=[rs(0, 1000), p2p(0, 3.0)], r1=[rs(1, 999), p2p(1, 3.0)]),
     ["r1 rs: fsdp0 call 0: reduce_scatter of 999 B on rank 1, but reduce_scatter of 1000 B "
      "on rank 0 (r0 rs)"]),
    (two_by_two(r2=[ag(2, 1.0), Call("send", "pp", (0, 2), 64, 3.0, peer=0)]),
     ["r0 send@3.0: pp.0>2: rank 0 has 1 calls in the iteration, rank 2 has 0"]),
    (two_by_two(r0=[dataclasses.replace(ag(0, 1.0), axis="fsdp", members=(0, 1, 2))]),
     ["fsdp groups differ in size"]),
    (two_by_two(r0=[dataclasses.replace(ag(0, 1.0), kind="send", peer=1)]),
     ["send on a fsdp group", "pipeline stages only"]),
    (two_by_two(r0=[dataclasses.replace(ag(0, 1.0), axis="world", members=(0, 1, 2, 3))]),
     ["axis 'world'"]),
    (two_by_two(r0=[dataclasses.replace(ag(0, 1.0), kind="broadcast")]),
     ["kind 'broadcast'"]),
])
def test_observations_that_cannot_be_a_schedule_are_refused(runs: dict[int, RankRun],
                                                           words: list[str]) -> None:
    with pytest.raises(CaptureError) as err:
        build(runs)
    for word in words:
        assert word in str(err.value)


def test_group_layouts_the_format_cannot_hold_are_refused() -> None:
    lonely = {r: RankRun(r, [Call("all_reduce", "dp", (0, 1), 8, 1.0)] if r < 2 else [],
                         0.0, 2.0) for r in range(3)}
    with pytest.raises(CaptureError, match=r"leave ranks \[2\] out"):
        build(lonely)
    not_stage_major = {r: RankRun(r, [Call("send" if r % 2 == 0 else "recv", "pp",
                                           (r - r % 2, r - r % 2 + 1), 8, 1.0,
                                           peer=r + 1 if r % 2 == 0 else r - 1)], 0.0, 2.0)
                       for r in range(4)}
    with pytest.raises(CaptureError, match="not stage-major"):
        build(not_stage_major)
    with pytest.raises(CaptureError, match=r"ranks \[1\] are missing"):
        build({0: RankRun(0, [], 0.0, 1.0), 2: RankRun(2, [], 0.0, 1.0)})
    with pytest.raises(CaptureError, match="do not fill servers of 3 GPUs"):
        build(two_by_two(), gps=3)


def test_calls_that_wait_for_each_other_in_a_cycle_are_refused() -> None:
    # Both pipeline ends wait for their receive before sending: nothing could ever start.
    def run(rank: int, peer: int) -> RankRun:
        members = (min(rank, peer), max(rank, peer))
        return RankRun(rank, [Call("recv", "pp", members, 8, 1.0, peer=peer, wait=(1.0, 2.0)),
                              Call("send", "pp", members, 8, 3.0, peer=peer)], 0.0, 4.0)
    with pytest.raises(CaptureError, match="cannot all complete"):
        build({0: run(0, 1), 1: run(1, 0)})
