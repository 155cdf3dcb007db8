"""Group inference without timestamps (workloads.comm_groups) on small hand-made call lists.

Four ranks, two pairings: ``fsdp`` pairs [0, 1] and [2, 3], ``pp`` pairs [0, 2] and [1, 3].
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from workloads.comm_groups import GroupInferenceError, GroupView, assign_groups


@dataclass
class Call:
    kind: str
    size_bytes: int
    candidates: list[str] = field(default_factory=lambda: ["fsdp", "pp"])
    group_peer: int = -1
    source: str = "trace: event"


MEMBERS = {r: {"fsdp": (r - r % 2, r - r % 2 + 1), "pp": (r % 2, r % 2 + 2)} for r in range(4)}
VIEW = GroupView(MEMBERS, lambda r, g: f"{g} {list(MEMBERS[r][g])}")


def job(extra_size: dict[int, int]) -> dict[int, list[Call]]:
    """Every rank: an all-gather of 100 B, then one of ``extra_size[rank]`` B."""
    return {r: [Call("all_gather", 100), Call("all_gather", extra_size[r])] for r in range(4)}


def test_a_call_that_fits_two_groups_is_refused_unless_a_lane_ties_it_to_another() -> None:
    calls = job({0: 50, 1: 50, 2: 60, 3: 60})  # the 50/60 B calls fit the fsdp pairs only
    with pytest.raises(GroupInferenceError, match=r"rank 0 all_gather of 100 B fits group "
                                                  r"fsdp \[0, 1\] or pp \[0, 2\] alike"):
        assign_groups(calls, VIEW)
    lanes = {(r, i): "worker" for r in range(4) for i in range(2)}  # one thread runs both
    assert set(assign_groups(calls, VIEW, lanes).values()) == {"fsdp"}


def test_calls_of_one_lane_that_fit_no_common_group_are_refused() -> None:
    calls = job({0: 50, 1: 50, 2: 60, 3: 60})
    calls[0][0].candidates = ["pp"]
    calls[0][1].candidates = ["fsdp"]
    with pytest.raises(GroupInferenceError, match="fit no common process group"):
        assign_groups(calls, VIEW, {(0, 0): "t", (0, 1): "t"})


def test_sends_meet_receives_in_order_and_a_missing_one_is_named() -> None:
    calls = {0: [Call("send", 8, ["pp"], 1), Call("send", 16, ["pp"], 1)],
             1: [], 3: [],
             2: [Call("recv", 8, ["pp", "fsdp"], 0), Call("recv", 16, ["pp", "fsdp"], 0)]}
    view = GroupView({r: MEMBERS[r] for r in calls}, VIEW.label)
    assert set(assign_groups(calls, view).values()) == {"pp"}
    calls[2].pop()
    with pytest.raises(GroupInferenceError, match=r"rank 0 send of 16 B to group rank 1 could "
                                                  r"be on group pp \[0, 2\], but no other"):
        assign_groups(calls, view)


def test_members_whose_sequences_differ_in_order_are_refused() -> None:
    calls = {r: [Call("all_gather", 10, ["fsdp"]), Call("reduce_scatter", 20, ["fsdp"])]
             for r in range(4)}
    calls[1].reverse()
    with pytest.raises(GroupInferenceError, match=r"rank 0 all_gather of 10 B is its call 1 on "
                                                  r"group fsdp \[0, 1\], but rank 1's call 1"):
        assign_groups(calls, VIEW)
