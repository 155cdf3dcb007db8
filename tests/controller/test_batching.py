"""controller.batching: decisions that wait for a rail leave together, in order."""

from __future__ import annotations

from controller.batching import RailBatcher, compose
from controller.core import Decision
from controller.ocs import ApplyResult, Circuit, Reconfiguration


def decision(did: int, *reconfs: Reconfiguration) -> Decision:
    return Decision(did, "j", f"g{did}", 0, tuple(reconfs), False)


def rc(rail: int, add: tuple[tuple[int, int], ...] = (),
       remove: tuple[tuple[int, int], ...] = ()) -> Reconfiguration:
    return Reconfiguration.of(rail, add, remove)


def test_compose_applies_in_order() -> None:
    first = rc(0, add=((1, 2),), remove=((3, 4),))
    second = rc(0, add=((3, 5), (7, 8)), remove=((1, 2), (9, 10)))
    # (1,2) added then removed: never lit; (3,4) and (9,10) go; (3,5) and (7,8) come
    assert compose(0, [first, second]) == rc(0, add=((3, 5), (7, 8)),
                                              remove=((3, 4), (9, 10)))
    assert compose(0, [rc(0, remove=((1, 2),)), rc(0, add=((1, 2),))]) == rc(0)


def test_a_decision_on_an_idle_rail_starts_alone_at_once() -> None:
    b = RailBatcher()
    (batch,) = b.submit(decision(1, rc(0, add=((1, 2),))))
    assert [d.decision_id for d in batch.decisions] == [1]
    assert batch.reconfs == (rc(0, add=((1, 2),)),)
    (other,) = b.submit(decision(2, rc(1, add=((1, 2),))))  # another rail: its own request
    assert other.rails == {1} and b.in_flight == 2


def test_decisions_waiting_for_a_rail_leave_together_as_one_request() -> None:
    b = RailBatcher()
    (first,) = b.submit(decision(1, rc(0, add=((1, 2),))))
    assert b.submit(decision(2, rc(0, add=((3, 4),), remove=((5, 6),)))) == []
    assert b.submit(decision(3, rc(0, add=((5, 7),)))) == []  # uses port 5, freed by 2
    assert b.waiting == 2
    done, (batch,) = b.finished(first.batch_id)
    assert done is first
    assert [d.decision_id for d in batch.decisions] == [2, 3]
    assert batch.reconfs == (rc(0, add=((3, 4), (5, 7)), remove=((5, 6),)),)
    assert b.waiting == 0 and b.in_flight == 1


def test_a_rail_decisions_never_pass_a_waiting_multi_rail_decision() -> None:
    b = RailBatcher()
    (on1,) = b.submit(decision(1, rc(1, add=((1, 2),))))
    assert b.submit(decision(2, rc(0, add=((1, 2),)), rc(1, add=((3, 4),)))) == []
    assert b.submit(decision(3, rc(0, add=((5, 6),)))) == []  # rail 0 is behind decision 2
    (on2,) = b.submit(decision(4, rc(2, add=((1, 2),))))  # rail 2 is free
    assert [d.decision_id for d in on2.decisions] == [4]
    _done, (batch,) = b.finished(on1.batch_id)
    assert [d.decision_id for d in batch.decisions] == [2, 3]
    assert batch.rails == {0, 1}


def test_split_gives_each_decision_its_circuits_with_the_batch_times() -> None:
    b = RailBatcher()
    (first,) = b.submit(decision(1, rc(0, add=((1, 2),))))
    b.submit(decision(2, rc(0, add=((3, 4),))))
    b.submit(decision(3, rc(0, add=((5, 6),))))
    _done, (batch,) = b.finished(first.batch_id)
    lit = ApplyResult(0, frozenset({Circuit(0, 3, 4), Circuit(0, 5, 6)}), frozenset(),
                      1.0, 1.1, 1.2)
    split = batch.split([lit])
    assert split[2] == [ApplyResult(0, frozenset({Circuit(0, 3, 4)}), frozenset(), 1.0, 1.1,
                                    1.2)]
    assert split[3][0].added == {Circuit(0, 5, 6)} and split[3][0].t_light_s == 1.2
