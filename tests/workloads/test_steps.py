"""Step plans: ring, pairwise and pairwise-exchange lowering, and their wire bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workloads.steps import lower, wire_bytes


def test_ring_all_gather_plan() -> None:
    plan = lower("g:x", "all_gather", (10, 11, 12), [5, 5, 5])
    assert len(plan.steps) == 2 and plan.algorithm == "ring"
    assert plan.peers(10) == [(11, 12, 5), (11, 12, 5)]


def test_ring_all_reduce_plan_has_two_phases() -> None:
    plan = lower("g:x", "all_reduce", (0, 1, 2, 3), [400])
    assert len(plan.steps) == 6
    assert all(t.size_bytes == 100 for step in plan.steps for t in step)
    assert plan.sent_bytes(0) == 600  # 2 (n-1)/n of 400


def test_send_recv_plan() -> None:
    plan = lower("pp0:act", "send", (0, 8), [64])
    assert plan.steps == (plan.steps[0],) and plan.sent_bytes(0) == 64
    assert plan.received_bytes(8) == 64


def test_all_to_all_plan_skips_own_block() -> None:
    splits = [(1, 2, 3), (4, 5, 6), (7, 8, 9)]
    plan = lower("ep0:x", "all_to_all", (0, 1, 2), [6, 15, 24], splits)
    assert [plan.sent_bytes(r) for r in range(3)] == [5, 10, 15]
    assert [plan.received_bytes(r) for r in range(3)] == [11, 10, 9]
    for step in plan.steps:  # every step is a permutation: one send and one receive per rank
        assert sorted(t.src for t in step) == sorted(t.dst for t in step) == [0, 1, 2]


@given(n=st.integers(2, 12), chunk=st.integers(1, 10_000))
def test_ring_wire_bytes_are_n_minus_one_over_n_of_the_data(n: int, chunk: int) -> None:
    ranks = tuple(range(n))
    ag = lower("g:ag", "all_gather", ranks, [chunk] * n)
    rs = lower("g:rs", "reduce_scatter", ranks, [chunk * n])
    data = chunk * n  # gathered output / reduce-scatter input
    for r in ranks:
        assert ag.sent_bytes(r) == wire_bytes("all_gather", n, r, chunk) == (n - 1) * data // n
        assert rs.sent_bytes(r) == wire_bytes("reduce_scatter", n, r, data) == \
            (n - 1) * data // n
        assert ag.received_bytes(r) == rs.received_bytes(r) == (n - 1) * data // n


@given(n=st.integers(2, 9), size=st.integers(1, 100_000), kind=st.sampled_from(
    ["all_gather", "reduce_scatter", "all_reduce"]))
def test_wire_bytes_match_the_step_plan_for_uneven_sizes(n: int, size: int, kind: str) -> None:
    plan = lower("g:x", kind, tuple(range(n)), [size] * n)
    for pos in range(n):
        assert plan.sent_bytes(pos) == wire_bytes(kind, n, pos, size)
