"""Group construction, placement and circuits against hand-computed values."""

from __future__ import annotations

import numpy as np
from wl_helpers import TINY_MOE, tiny

from workloads import Cluster, ParallelConfig, Schedule
from workloads.layout import build_groups, hop_circuit, ring_circuits


def _ids(p: ParallelConfig, axis: str) -> list[list[int]]:
    return build_groups(p).get(axis).ranks.tolist()  # type: ignore[union-attr]


def test_paper_groups() -> None:
    p = ParallelConfig(tp=4, fsdp=2, pp=2)
    assert _ids(p, "tp") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert _ids(p, "fsdp") == [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14],
                               [11, 15]]
    assert _ids(p, "pp") == [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14],
                             [7, 15]]


def test_degree_one_axes_are_singletons() -> None:
    p = ParallelConfig(tp=4, fsdp=2, pp=2)
    for axis in ("dp", "cp", "ep"):
        assert _ids(p, axis) == [[r] for r in range(16)]
    # without EP, expert replicas span the whole shard group
    assert _ids(p, "edp") == _ids(p, "fsdp")


def test_pp_one_has_singleton_pipeline_groups() -> None:
    assert _ids(ParallelConfig(tp=2, dp=2), "pp") == [[0], [1], [2], [3]]


def test_cp_groups_sit_between_tp_and_fsdp() -> None:
    p = ParallelConfig(tp=2, cp=2, fsdp=2)
    assert _ids(p, "cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    # FSDP shards over fsdp x cp (TorchTitan's dp_shard_cp)
    assert _ids(p, "fsdp") == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_ddp_group_spans_dp_and_cp() -> None:
    p = ParallelConfig(dp=2, cp=2)
    assert _ids(p, "dp") == [[0, 1, 2, 3]]
    assert _ids(ParallelConfig(dp=2, fsdp=2, cp=2), "dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_ep_groups_are_carved_from_data_parallel_ranks() -> None:
    p = ParallelConfig(tp=2, dp=2, fsdp=2, ep=2)
    # data-parallel index d = dp_i * 2 + fsdp_i = rank // 2; EP pairs d = (0,1), (2,3)
    assert _ids(p, "ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert _ids(p, "edp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_placement_helpers() -> None:
    c = Cluster(4, 4)
    assert [c.server_of(r) for r in (0, 3, 4, 15)] == [0, 0, 1, 3]
    assert [c.rail_of(r) for r in (0, 3, 4, 15)] == [0, 3, 0, 3]
    s = tiny(2, 2, tp=2, dp=2)
    assert s.server_of(3) == 1 and s.rail_of(3) == 1 and s.cluster.rails == 2


def test_scale_up_flags_on_groups() -> None:
    s = tiny(2, 4, tp=2, dp=2, pp=2)  # a server holds one pipeline stage
    assert s.group_scale_up("tp").all()
    assert s.group_scale_up("dp").all()  # dp pairs (0,2),(1,3) share a server
    assert not s.group_scale_up("pp").any()


def test_ring_circuits_same_rail() -> None:
    c = Cluster(4, 4)
    assert ring_circuits([0, 4, 8, 12], c) == {0: [(0, 4), (0, 12), (4, 8), (8, 12)]}
    assert ring_circuits([1, 5], c) == {1: [(1, 5)]}
    assert ring_circuits([0, 1, 2, 3], c) == {}


def test_cross_rail_hop_goes_through_pxn_proxy() -> None:
    c = Cluster(2, 4)
    # rank 2 (server 0, rail 2) -> rank 4 (server 1, rail 0): via rank 0 on rail 0
    assert hop_circuit(2, 4, c) == (0, (0, 4))
    assert ring_circuits([0, 2, 4, 6], c) == {0: [(0, 4)]}


def test_group_lookup_round_trip() -> None:
    s: Schedule = tiny(2, 2, model=TINY_MOE, tp=1, fsdp=4, ep=2)
    for axis in ("fsdp", "ep", "edp"):
        for r in range(4):
            gid = s.group_of(r, axis)
            assert r in s.group_ranks(gid)
    assert np.array_equal(s.groups["ep"].ranks, np.array([[0, 1], [2, 3]]))
