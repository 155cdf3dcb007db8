"""Collective algorithms: the 1-factorization, multihop forwarding, StragglAR, segment packing.

Data checks run a lowering's transfers on integer vectors (:func:`run_data`): contributors
start with random values, an ``add`` transfer adds the sender's current value, a ``copy``
overwrites; every owner must end with the sum of the contributors' values (empty blocks
have nothing to deliver).
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.algorithms import (
    ALGORITHM,
    ALGORITHMS,
    check_algorithm,
    lower,
    one_factorization,
    pack_segments,
    stragglar_rounds,
)
from workloads.steps import StepPlan, wire_bytes


def run_data(plan: StepPlan, seed: int = 0, width: int = 3) -> None:
    """Run ``plan`` on random integer vectors and assert every owner ends with its block."""
    rng = random.Random(seed)
    blocks = {b.block_id: b for b in plan.blocks}
    assert len(blocks) == len(plan.blocks)
    own = {(r, b.block_id): [rng.randrange(1000) for _ in range(width)]
           for b in plan.blocks for r in b.contributors}
    buf = {(r, bid): list(v) for (r, bid), v in own.items()}
    for step in plan.steps:
        sent = [(t, [(bid, op, list(buf.get((t.src, bid), [0] * width))) for bid, op in t.blocks])
                for t in step]  # every send of a step leaves before its receptions land
        for t, parts in sent:
            assert t.size_bytes == sum(blocks[bid].size_bytes for bid, _, _ in parts)
            for bid, op, value in parts:
                mine = buf.setdefault((t.dst, bid), [0] * width)
                buf[(t.dst, bid)] = ([a + b for a, b in zip(mine, value, strict=True)]
                                     if op == "add" else value)
    for b in plan.blocks:
        if not b.size_bytes:
            continue  # nothing to deliver
        want = [sum(own[(c, b.block_id)][e] for c in b.contributors) for e in range(width)]
        for r in b.owners:
            assert buf.get((r, b.block_id)) == want, (plan.algorithm, r, b)


def splits_of(n: int, rng: random.Random, low: int = 0) -> list[list[int]]:
    return [[0 if i == j else rng.randrange(low, 50) for j in range(n)] for i in range(n)]


# --------------------------------------------------------------------- 1-factorization

@pytest.mark.parametrize("n", range(2, 33))
def test_one_factorization_serves_every_pair_exactly_once_in_matchings(n: int) -> None:
    rounds = one_factorization(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen: Counter[tuple[int, int]] = Counter()
    for r, pairs in enumerate(rounds):
        ranks = [x for p in pairs for x in p]
        assert len(ranks) == len(set(ranks)), f"round {r} is not a matching"
        if n % 2 == 0:
            assert len(pairs) == n // 2  # perfect
        else:
            assert sorted(set(range(n)) - set(ranks)) == [r]  # rank r idles in round r
        seen.update(pairs)
    assert seen == Counter(itertools.combinations(range(n), 2))
    if n % 2 == 0:  # the closed form of the circle method
        for r, pairs in enumerate(rounds):
            for a, b in pairs:
                expect = n - 1 if a == r else (r if a == n - 1 else (2 * r - a) % (n - 1))
                assert b == expect


@given(n=st.integers(2, 12), seed=st.integers(0, 1000))
def test_matchings_deliver_exactly_the_pairwise_exchange_bytes(n: int, seed: int) -> None:
    rng = random.Random(seed)
    splits = splits_of(n, rng)
    sizes = [sum(s) for s in splits]
    ranks = tuple(rng.sample(range(100), n))
    plan = lower("ep0:x", "all_to_all", "matchings", ranks, sizes, splits, with_blocks=True)
    pairwise = lower("ep0:x", "all_to_all", "pairwise", ranks, sizes, splits)
    run_data(plan, seed)
    delivered: Counter[tuple[int, int]] = Counter()
    for step in plan.steps:
        peers: dict[int, int] = {}
        for t in step:  # each step: a matching of exchanges
            assert peers.setdefault(t.src, t.dst) == t.dst
            assert peers.setdefault(t.dst, t.src) == t.src
            delivered[(t.src, t.dst)] += t.size_bytes
    for i, j in itertools.permutations(range(n), 2):
        assert delivered[(ranks[i], ranks[j])] == splits[i][j]
    for pos, r in enumerate(ranks):
        assert plan.sent_bytes(r) == pairwise.sent_bytes(r) == wire_bytes(
            "all_to_all", n, pos, sizes[pos], splits[pos])


# ------------------------------------------------------------------------- multihop

@given(n=st.integers(2, 12), seed=st.integers(0, 1000))
def test_multihop_forwards_every_block_home_over_ring_neighbours(n: int, seed: int) -> None:
    rng = random.Random(seed)
    splits = splits_of(n, rng)
    ranks = tuple(range(n))
    plan = lower("ep0:x", "all_to_all", "multihop", ranks, [sum(s) for s in splits], splits,
                 with_blocks=True)
    run_data(plan, seed)  # every block reaches its destination, relays forward what they got
    for step in plan.steps:
        for t in step:
            assert (t.dst - t.src) % n in (1, n - 1), "multihop only uses ring neighbours"
    home = {b.block_id: b.owners[0] for b in plan.blocks if b.size_bytes}
    for bid, dest in home.items():  # the block's bytes reach the destination once
        arrivals = [t for s in plan.steps for t in s if t.dst == dest
                    and any(b == bid for b, _ in t.blocks)]
        assert len(arrivals) == 1


@pytest.mark.parametrize("n", range(3, 33))
def test_multihop_loads_each_directed_link_with_n_squared_over_8_blocks(n: int) -> None:
    block = 64
    splits = [[0 if i == j else block for j in range(n)] for i in range(n)]
    plan = lower("ep0:x", "all_to_all", "multihop", tuple(range(n)), [block * n] * n, splits)
    load: Counter[tuple[int, int]] = Counter()
    for step in plan.steps:
        for t in step:
            load[(t.src, t.dst)] += t.size_bytes
    want = (n * n if n % 2 == 0 else n * n - 1) * block // 8
    assert set(load.values()) == {want}
    assert len(load) == 2 * n  # both directions of every ring link
    assert len(plan.steps) == n // 2 == ALGORITHM["multihop"].step_count("all_to_all", n)
    assert plan.sent_bytes(0) == 2 * want


# ------------------------------------------------------------------------ stragglar

@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64])
def test_stragglar_rounds_are_matchings_and_reach_the_published_count(n: int) -> None:
    rounds = stragglar_rounds(n)
    log_n = n.bit_length() - 1
    assert len(rounds) == n - 2 + log_n  # arXiv 2505.23523: n - 2 + log2 n rounds
    received: Counter[int] = Counter()
    for t, moves in enumerate(rounds):
        peer: dict[int, int] = {}
        sends: Counter[int] = Counter()
        for kind, a, b, _chunk in moves:
            assert peer.setdefault(a, b) == b and peer.setdefault(b, a) == a
            sends[a] += 1
            received[b] += 1
            if kind == "X":
                sends[b] += 1
                received[a] += 1
        assert max(sends.values()) == 1  # one chunk out per rank and round
        swaps = [m for m in moves if m[0] == "X"]
        assert swaps == ([("X", t, n - 1, t)] if t <= n - 2 else [])
    assert set(received.values()) == {n - 1} and len(received) == n


def test_stragglar_schedule_of_four_ranks_is_the_hand_worked_one() -> None:
    """The 4-rank example of the design note (section 2.6): X = swap with the straggler,
    C = copy of a reduced chunk; round 3 and 4 hold two-way exchanges."""
    assert stragglar_rounds(4) == (
        (("X", 0, 3, 0),),
        (("X", 1, 3, 1), ("C", 0, 2, 0)),
        (("X", 2, 3, 2), ("C", 1, 0, 1), ("C", 0, 1, 0)),
        (("C", 2, 0, 2), ("C", 0, 2, 1), ("C", 3, 1, 2)))


@pytest.mark.parametrize(("n", "at"), [(2, 0), (4, 0), (4, 2), (8, 7), (8, 3), (16, 5),
                                       (32, 31)])
def test_stragglar_ends_with_the_full_sum_on_every_rank(n: int, at: int) -> None:
    ranks = tuple(range(10, 10 + n))
    size = 7 * (n - 1) + 3  # uneven chunks
    plan = lower("dp0:g", "all_reduce", "stragglar", ranks, [size], straggler=ranks[at],
                 with_blocks=True)
    run_data(plan, n)
    straggler = ranks[at]
    rs = n - 2
    assert plan.sync == (False,) * rs + (True,) * (n - 2 + n.bit_length() - 1)
    for step in plan.steps[:rs]:  # the reduce-scatter runs without the straggler
        assert all(straggler not in (t.src, t.dst) for t in step)
    assert len(plan.steps) == ALGORITHM["stragglar"].step_count("all_reduce", n)


def test_stragglar_without_a_straggler_is_the_ring() -> None:
    plan = lower("dp0:g", "all_reduce", "stragglar", (0, 1, 2, 3), [400])
    assert plan.algorithm == "ring" and len(plan.steps) == 6


@given(n=st.integers(2, 9), size=st.integers(1, 5000),
       kind=st.sampled_from(["all_gather", "reduce_scatter", "all_reduce"]))
@settings(max_examples=40)
def test_ring_lowerings_deliver_their_data(n: int, size: int, kind: str) -> None:
    plan = lower("g:x", kind, "ring", tuple(range(n)), [size] * n, with_blocks=True)
    run_data(plan, size)


def test_pairwise_lowerings_deliver_their_data() -> None:
    rng = random.Random(3)
    splits = splits_of(5, rng, low=1)
    run_data(lower("ep0:x", "all_to_all", "pairwise", tuple(range(5)),
                   [sum(s) for s in splits], splits, with_blocks=True))
    run_data(lower("pp0:x", "send", "pairwise", (0, 8), [64], with_blocks=True))


# ------------------------------------------------------------------------- segments

@pytest.mark.parametrize(("n", "k", "count"), [(8, 1, 7), (8, 2, 4), (8, 4, 2), (8, 7, 1),
                                               (32, 1, 31), (32, 2, 16), (32, 4, 8),
                                               (7, 1, 7), (7, 2, 4)])
def test_matching_rounds_pack_into_segments_that_fit_the_ports(n: int, k: int,
                                                              count: int) -> None:
    splits = [[0 if i == j else 8 for j in range(n)] for i in range(n)]
    plan = lower("ep0:x", "all_to_all", "matchings", tuple(range(n)), [8 * n] * n, splits)
    segments = pack_segments(plan.units, k)
    assert len(segments) == count
    assert [s.first for s in segments] == list(itertools.accumulate(
        [0] + [s.count for s in segments[:-1]]))
    assert sum(s.count for s in segments) == len(plan.steps)
    for s in segments:
        degree = Counter(x for p in s.pairs or () for x in p)
        assert max(degree.values()) <= k
    assert len(pack_segments(plan.units, None)) == 1  # electrical: one call


@pytest.mark.parametrize(("k", "post"), [(1, 9), (2, 5), (3, 3), (4, 2)])
def test_stragglar_keeps_its_reduce_scatter_apart_and_packs_its_rounds(k: int,
                                                                       post: int) -> None:
    plan = lower("dp0:g", "all_reduce", "stragglar", tuple(range(8)), [7000], straggler=7)
    segments = pack_segments(plan.units, k)
    assert segments[0].name == "rs0" and segments[0].count == 6
    assert 7 not in segments[0].ranks  # the straggler's arrival does not hold it up
    assert len(segments) - 1 == post
    assert all(7 in s.ranks for s in segments[1:2])
    for s in segments:
        assert max(Counter(x for p in s.pairs or () for x in p).values()) <= max(k, 2)


def test_ports_each_algorithm_needs() -> None:
    assert [ALGORITHM[a].min_ports("all_to_all", 8) for a in ALGORITHMS["all_to_all"]] == [
        7, 1, 2]
    assert ALGORITHM["stragglar"].min_ports("all_reduce", 8) == 2  # the ring of 7
    assert ALGORITHM["stragglar"].min_ports("all_reduce", 2) == 1
    assert ALGORITHM["ring"].min_ports("all_reduce", 2) == 1


def test_unknown_algorithms_are_named() -> None:
    with pytest.raises(ValueError, match="'matchings' does not exist for all_gather; choose ring"):
        check_algorithm("all_gather", "matchings")
    with pytest.raises(ValueError, match="power-of-two"):
        stragglar_rounds(6)
