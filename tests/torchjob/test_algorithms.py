"""The torch backend's algorithms: the schedule's ring and exchange, with real data."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from testbed.torchjob.algorithms import (
    broadcast_steps,
    chunk_bounds,
    exchange_steps,
    ring_sent_bytes,
    ring_steps,
)
from workloads.steps import lower


def _simulate(kind: str, inputs: list[list[int]]) -> list[list[int]]:
    """Run ring ``kind`` step by step on every member's copy (lists of integers)."""
    n = len(inputs)
    bounds = (chunk_bounds(len(inputs[0]), n) if kind != "all_gather"
              else [(j * len(inputs[0]), (j + 1) * len(inputs[0])) for j in range(n)])
    if kind == "all_gather":
        data = [[0] * (n * len(inputs[0])) for _ in range(n)]
        for i in range(n):
            a, b = bounds[i]
            data[i][a:b] = inputs[i]
    else:
        data = [list(x) for x in inputs]
    plans = [ring_steps(kind, n, i) for i in range(n)]
    for k in range(len(plans[0])):
        sent = [data[i][slice(*bounds[plans[i][k].send_chunk])] for i in range(n)]
        for i in range(n):
            step = plans[i][k]
            assert step.recv_chunk == plans[(i - 1) % n][k].send_chunk  # what i-1 sends
            a, b = bounds[step.recv_chunk]
            got = sent[(i - 1) % n]
            data[i][a:b] = [x + y for x, y in zip(got, data[i][a:b], strict=True)] \
                if step.reduce else got
    return data


@given(n=st.integers(2, 7), numel=st.integers(0, 40))
def test_ring_collectives_compute_what_torch_specifies(n: int, numel: int) -> None:
    inputs = [[100 * i + j for j in range(numel)] for i in range(n)]
    total = [sum(col) for col in zip(*inputs, strict=True)]
    assert _simulate("all_reduce", inputs) == [total] * n
    scattered = _simulate("reduce_scatter", inputs)
    for i, (a, b) in enumerate(chunk_bounds(numel, n)):
        assert scattered[i][a:b] == total[a:b]  # position i ends with chunk i reduced
    gathered = [x for inp in inputs for x in inp]
    assert _simulate("all_gather", inputs) == [gathered] * n


@given(n=st.integers(2, 9), per_rank=st.integers(0, 50), element_size=st.sampled_from([1, 2, 4]))
def test_ring_bytes_equal_the_schedule_lowering_byte_for_byte(n: int, per_rank: int,
                                                              element_size: int) -> None:
    """When n divides the elements (reduce-scatter always, FSDP's padded shards, every
    all-gather), each step sends exactly the schedule's bytes (workloads.steps.lower)."""
    ranks = tuple(range(10, 10 + n))
    numel = per_rank * n
    for kind, message in (("all_gather", per_rank), ("reduce_scatter", numel),
                          ("all_reduce", numel)):
        plan = lower("g:c", kind, ranks, [message * element_size] * n)
        for i, rank in enumerate(ranks):
            steps = [to_bytes for to, _, to_bytes in plan.peers(rank)]
            assert ring_sent_bytes(kind, n, i, message, element_size) == steps, (kind, i)


@given(n=st.integers(2, 9), numel=st.integers(0, 200))
def test_uneven_chunks_stay_within_an_element_of_the_schedule(n: int, numel: int) -> None:
    """An all-reduce of any size: chunks cut on elements, off by less than one element."""
    element_size = 4
    plan = lower("g:c", "all_reduce", tuple(range(n)), [numel * element_size])
    for i in range(n):
        ours = ring_sent_bytes("all_reduce", n, i, numel, element_size)
        theirs = [b for _, _, b in plan.peers(i)]
        assert all(abs(a - b) < element_size for a, b in zip(ours, theirs, strict=True))


def test_exchange_and_broadcast_follow_the_ring() -> None:
    assert exchange_steps(4, 1) == [(2, 0), (3, 3), (0, 2)]
    plan = lower("ep:c", "all_to_all", (0, 1, 2, 3), [4] * 4, [[1] * 4] * 4)
    for k, step in enumerate(plan.steps):
        for t in step:
            assert exchange_steps(4, t.src)[k][0] == t.dst
    # a chain from the root along the ring: every member receives once, from its predecessor
    chain = [broadcast_steps(5, i, root=2) for i in range(5)]
    assert chain[2] == (None, 3) and chain[1] == (0, None)
    assert all(frm == (i - 1) % 5 for i, (frm, _) in enumerate(chain) if i != 2)


def test_a_single_member_ring_has_no_steps() -> None:
    assert ring_steps("all_reduce", 1, 0) == []
    assert chunk_bounds(5, 2) == [(0, 3), (3, 5)]
