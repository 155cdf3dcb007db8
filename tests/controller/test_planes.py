"""The rival planes' pure decisions (:mod:`controller.planes`): the rotor's cycle and clock, the
static topology, and relay paths."""

from __future__ import annotations

import itertools

import pytest

from controller.planes import check_matching, check_plane, switches
from controller.planes.relay import adjacency, rotor_route, route
from controller.planes.rotor import RotorSchedule, default_slot_s, round_robin
from controller.planes.static import static_topology, unreachable


@pytest.mark.parametrize("n", range(2, 10))
def test_round_robin_meets_every_pair_exactly_once(n: int) -> None:
    cycle = round_robin(n)
    assert len(cycle) == (n - 1 if n % 2 == 0 else n)
    met = [frozenset((s, t)) for m in cycle for s, t in m.items() if s < t]
    assert sorted(map(sorted, met)) == sorted(map(list, itertools.combinations(range(n), 2)))
    for m in cycle:
        check_matching(m, n, "test")
        assert len(m) == n - n % 2  # perfect, or one idle server for an odd count


def test_rotor_switches_hold_distinct_matchings_and_follow_the_cycle() -> None:
    sw = switches(4, 1)
    rotor = RotorSchedule.build(16, sw, delay_s=1e-3)
    assert rotor.slot_s == pytest.approx(10e-3)
    assert rotor.period_slots == 15  # 15 matchings, 4 switches: gcd 1
    for slot in range(30):
        held = [rotor.matching_index(j, slot) for j in range(4)]
        assert len(set(held)) == 4
        assert held == [(j + 4 * slot) % 15 for j in range(4)]
    # every matching comes round on each switch within a period
    assert {rotor.matching_index(0, i) for i in range(15)} == set(range(15))


def test_rotor_slot_timing() -> None:
    rotor = RotorSchedule.build(4, switches(1, 1), delay_s=2e-3, slot_s=5e-3)
    assert rotor.light_s(3) == pytest.approx(17e-3)
    assert rotor.slot_at(14.999e-3) == 2
    assert rotor.slot_at(15e-3) == 3
    assert default_slot_s(1e-8) == 1e-4  # the floor
    assert default_slot_s(0.1) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="longer than the switching delay"):
        RotorSchedule.build(4, switches(1, 1), delay_s=5e-3, slot_s=5e-3)


def test_check_plane_names_the_choices() -> None:
    assert check_plane("rotor") == "rotor"
    with pytest.raises(ValueError, match="opus, static, rotor"):
        check_plane("sirius")


RING8 = {(i, (i + 1) % 8) if i < 7 else (0, 7): 100.0 for i in range(8)}


def test_static_ring_takes_its_two_matchings() -> None:
    topo = static_topology(RING8, 8, switches(2, 1))
    edges = {frozenset((s, t)) for m in topo.values() for s, t in m.items()}
    assert edges == {frozenset(p) for p in RING8}
    assert unreachable(RING8, topo, 8) == []


def test_static_reach_comes_before_weight() -> None:
    # two heavy pairs and one light pair that joins them: with two switches the light pair gets
    # the second (reach), not a second circuit of a heavy pair (weight)
    demand = {(0, 1): 1000.0, (2, 3): 1000.0, (1, 2): 1.0}
    topo = static_topology(demand, 4, switches(2, 1))
    assert topo[(1, 0)] == {1: 2, 2: 1}
    # with a third switch the heavy pairs get their second circuit
    topo = static_topology(demand, 4, switches(3, 1))
    assert topo[(2, 0)] == {0: 1, 1: 0, 2: 3, 3: 2}


def test_static_with_too_few_switches_leaves_pairs_unreachable() -> None:
    topo = static_topology(RING8, 8, switches(1, 1))
    assert len(unreachable(RING8, topo, 8)) == 4
    with pytest.raises(ValueError, match="demand pair"):
        static_topology({(3, 1): 5.0}, 4, switches(1, 1))


def test_route_prefers_direct_then_least_loaded_relay() -> None:
    config = {(0, 0): {0: 1, 1: 0, 2: 3, 3: 2}, (1, 0): {1: 2, 2: 1, 0: 3, 3: 0}}
    adj = adjacency(config)
    assert route(adj, 0, 1, lambda *_: 0) == [((0, 0), 0, 1)]
    # 0 -> 2: two shortest paths, through 1 or through 3; the loaded one is avoided
    load = {((0, 0), 0, 1): 5}
    path = route(adj, 0, 2, lambda sw, u, v: load.get((sw, u, v), 0))
    assert path == [((1, 0), 0, 3), ((0, 0), 3, 2)]
    assert route(adj, 0, 2, lambda *_: 0, max_hops=1) is None
    with pytest.raises(ValueError, match="scale-up"):
        route(adj, 2, 2, lambda *_: 0)


def test_rotor_route_is_direct_unless_a_relay_has_spare_capacity() -> None:
    config = {(0, 0): {0: 1, 1: 0, 2: 3, 3: 2}, (1, 0): {1: 2, 2: 1, 0: 3, 3: 0},
              (2, 0): {0: 2, 2: 0, 1: 3, 3: 1}}
    adj = adjacency(config)
    assert rotor_route(adj, 0, 1, lambda *_: 0) == [((0, 0), 0, 1)]  # a tie: direct
    busy = {((0, 0), 0, 1): 2}
    path = rotor_route(adj, 0, 1, lambda sw, u, v: busy.get((sw, u, v), 0))
    assert path is not None and len(path) == 2  # the direct circuit is loaded: two idle hops
    assert rotor_route(adjacency({(0, 0): {0: 1, 1: 0}}), 2, 3, lambda *_: 0) is None
