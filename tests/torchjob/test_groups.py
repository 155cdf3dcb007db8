"""Torch groups as Opus comm groups: axes, lanes, the job, and what the rails refuse."""

from __future__ import annotations

from typing import Any

import pytest

from controller.job import JobError, JobSpec, rail_job_ports
from testbed.torchjob.groups import (
    GroupError,
    axis_of,
    collective_lane,
    is_scale_up,
    observed_groups,
    p2p_lane,
    rail_groups,
)


def _call(rank: int, op: str, lane: str, members: list[int], peer: int = -1,
          desc: str = "mesh_fsdp") -> dict[str, Any]:
    return {"ev": "call", "rank": rank, "op": op, "lane": lane, "axis": axis_of(desc),
            "members": members, "peer": peer, "torch_group": desc}


def test_axis_names_come_from_the_device_mesh() -> None:
    assert [axis_of(d) for d in ("mesh_pp", "mesh_fsdp", "mesh_replicate", "mesh_shard",
                                 "default_pg", "undefined", "my-group 7")] == [
        "pp", "fsdp", "dp", "fsdp", "world", "undefined", "mygroup"]
    assert axis_of("mesh_fsdp", {"mesh_fsdp": "dp"}) == "dp"


def test_lanes_are_named_alike_on_every_member() -> None:
    assert collective_lane("fsdp", (2, 3)) == "fsdp2-3"
    assert p2p_lane(2, 0) == p2p_lane(0, 2) == "p2p0-2"
    assert is_scale_up((2, 3), gpus_per_server=2) and not is_scale_up((1, 2), gpus_per_server=2)


def _job_records() -> list[dict[str, Any]]:
    """The 2x2 FSDP x PP job's calls as two of its ranks record them."""
    return [_call(0, "all_gather_single", "fsdp0-1", [0, 1]),
            _call(1, "all_gather_single", "fsdp0-1", [0, 1]),
            _call(0, "send", "p2p0-2", [0, 2], peer=2, desc="mesh_pp"),
            _call(2, "recv", "p2p0-2", [0, 2], peer=0, desc="mesh_pp"),
            {"ev": "iteration", "rank": 0, "it": 0}]


def test_the_reference_records_give_the_job_opus_registers() -> None:
    observed = observed_groups(_job_records())
    assert {g.lane: (g.members, g.pattern, g.axis) for g in observed.values()} == {
        "fsdp0-1": ((0, 1), "ring", "fsdp"), "p2p0-2": ((0, 2), "pairs", "pp")}
    groups = rail_groups(observed, gpus_per_server=1, rail_of=lambda r: 0)
    job = JobSpec("train", rail_job_ports(range(4), 1, 1), groups)
    assert job.demand == {"fsdp0-1": {0: frozenset({(0, 1)})},
                          "p2p0-2": {0: frozenset({(0, 2)})}}


def test_records_that_disagree_on_members_are_refused() -> None:
    bad = [_call(0, "all_gather_single", "fsdp0-1", [0, 1]),
           _call(1, "all_gather_single", "fsdp0-1", [1, 0])]
    with pytest.raises(GroupError, match="lane fsdp0-1: rank 1's all_gather_single"):
        observed_groups(bad)


def test_scale_up_groups_stay_off_the_rails_and_cross_rail_groups_are_refused() -> None:
    rail_of = {0: 0, 1: 1, 2: 0, 3: 1}.__getitem__  # 2 servers x 2 GPUs, 2 rails
    observed = observed_groups([_call(0, "allreduce", "dp0-1", [0, 1], desc="mesh_replicate"),
                                _call(0, "all_gather_single", "fsdp0-2", [0, 2])])
    assert list(rail_groups(observed, gpus_per_server=2, rail_of=rail_of)) == ["fsdp0-2"]
    across = observed_groups([_call(1, "allreduce", "world0-1-2-3", [0, 1, 2, 3],
                                    desc="default_pg")])
    with pytest.raises(GroupError, match=r"group world0-1-2-3 \(members \[0, 1, 2, 3\], first "
                       r"used by rank 1's allreduce on torch group default_pg\) joins ranks 0 "
                       "and 1 on rails 0 and 1"):
        rail_groups(across, gpus_per_server=2, rail_of=rail_of)


def test_a_world_ring_on_one_port_per_rank_does_not_fit() -> None:
    observed = observed_groups([_call(0, "barrier", "world0-1-2-3", [0, 1, 2, 3],
                                      desc="default_pg")])
    groups = rail_groups(observed, gpus_per_server=1, rail_of=lambda r: 0)
    with pytest.raises(JobError, match="group world0-1-2-3 needs 2 circuits at rank 0"):
        JobSpec("train", rail_job_ports(range(4), 1, 1), groups)
