"""controller.ocs: circuits, requests, the one-to-one rule and JSON forms."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.ocs import (
    TECHNOLOGIES,
    TECHNOLOGY_ALIASES,
    ApplyResult,
    Circuit,
    CrossconnectState,
    RailDescription,
    Reconfiguration,
    ReconfigurationRejected,
    parse_delays_ms,
    resolve_switching_delay_ms,
)

PORTS = {0: range(1, 9), 1: range(1, 5)}


def make_state(circuits: Mapping[int, list[tuple[int, int]]] | None = None) -> CrossconnectState:
    """A state over :data:`PORTS` with ``circuits`` already applied."""
    state = CrossconnectState(PORTS)
    for rail, pairs in (circuits or {}).items():
        state.apply(Reconfiguration.of(rail, add=pairs))
    return state


def snapshot(state: CrossconnectState) -> dict[int, dict[int, int | None]]:
    """Every port's peer on every rail."""
    return {rail: {p: state.peer(rail, p) for p in state.ports(rail)} for rail in state.rails}


# --- Circuit ---------------------------------------------------------------------------------


def test_circuit_is_normalised_so_port_a_is_smaller() -> None:
    c = Circuit(0, 7, 3)
    assert (c.port_a, c.port_b) == (3, 7)
    assert c == Circuit(0, 3, 7)
    assert hash(c) == hash(Circuit(0, 3, 7))


def test_circuit_with_one_port_twice_is_rejected() -> None:
    with pytest.raises(ValueError, match="two ports"):
        Circuit(2, 5, 5)


def test_circuit_peer_of_gives_other_end_and_rejects_strangers() -> None:
    c = Circuit(1, 4, 2)
    assert c.peer_of(2) == 4
    assert c.peer_of(4) == 2
    with pytest.raises(ValueError, match="not an end"):
        c.peer_of(3)


def test_circuit_json_and_str_use_normalised_order() -> None:
    c = Circuit(3, 9, 1)
    assert c.to_json() == [1, 9]
    assert str(c) == "rail3:1<->9"


# --- Reconfiguration -------------------------------------------------------------------------


def test_reconfiguration_of_accepts_pairs_and_circuits() -> None:
    r = Reconfiguration.of(1, add=[(4, 2), Circuit(1, 3, 1)], remove=[(5, 6)])
    assert r.add == {Circuit(1, 2, 4), Circuit(1, 1, 3)}
    assert r.remove == {Circuit(1, 5, 6)}
    assert r.touched_ports == {1, 2, 3, 4, 5, 6}
    assert not r.is_empty
    assert Reconfiguration.of(1).is_empty


def test_reconfiguration_of_rejects_circuit_of_another_rail() -> None:
    with pytest.raises(ValueError, match="not on rail 1"):
        Reconfiguration.of(1, add=[Circuit(0, 1, 2)])


def test_reconfiguration_json_round_trip() -> None:
    r = Reconfiguration.of(2, add=[(5, 1), (3, 4)], remove=[(2, 6)])
    data = json.loads(json.dumps(r.to_json()))
    assert data == {"rail": 2, "add": [[1, 5], [3, 4]], "remove": [[2, 6]]}
    assert Reconfiguration.from_json(data) == r


def test_reconfiguration_from_json_defaults_missing_lists_to_empty() -> None:
    assert Reconfiguration.from_json({"rail": 0}) == Reconfiguration(0)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({}, "'rail'"),
        (None, "'rail'"),
        ([1, 2], "'rail'"),
        ({"rail": "0"}, "'rail'"),
        ({"rail": 1.0}, "'rail'"),
        ({"rail": True}, "'rail'"),
        ({"rail": 0, "add": {"1": 2}}, "'add'"),
        ({"rail": 0, "add": None}, "'add'"),
        ({"rail": 0, "add": [[1]]}, "'add'"),
        ({"rail": 0, "add": [[1, 2, 3]]}, "'add'"),
        ({"rail": 0, "add": [[1, "2"]]}, "'add'"),
        ({"rail": 0, "add": [[True, 2]]}, "'add'"),
        ({"rail": 0, "add": [7]}, "'add'"),
        ({"rail": 0, "remove": "1,2"}, "'remove'"),
        ({"rail": 0, "remove": [[1.5, 2]]}, "'remove'"),
        ({"rail": 0, "add": [[1, 2]], "remove": [[None, 2]]}, "'remove'"),
    ],
)
def test_reconfiguration_from_json_malformed_names_field(data: object, field: str) -> None:
    with pytest.raises(ValueError) as info:
        Reconfiguration.from_json(data)  # type: ignore[arg-type]
    assert field in str(info.value)


@pytest.mark.parametrize("key", ["add", "remove"])
def test_reconfiguration_from_json_self_loop_names_field(key: str) -> None:
    """A [p, p] pair is malformed too; the error must say in which list it sits."""
    with pytest.raises(ValueError) as info:
        Reconfiguration.from_json({"rail": 0, key: [[3, 3]]})
    assert f"'{key}'" in str(info.value)


# --- CrossconnectState: accepted requests ----------------------------------------------------


def test_apply_sets_symmetric_peers() -> None:
    state = make_state({0: [(1, 2), (5, 3)]})
    assert state.peer(0, 1) == 2 and state.peer(0, 2) == 1
    assert state.peer(0, 3) == 5 and state.peer(0, 5) == 3
    assert state.peer(0, 4) is None
    assert state.circuits(0) == {Circuit(0, 1, 2), Circuit(0, 3, 5)}
    assert state.circuits(1) == frozenset()
    assert state.all_circuits() == state.circuits(0)


def test_swap_in_one_request_is_accepted() -> None:
    state = make_state({0: [(1, 2)]})
    state.apply(Reconfiguration.of(0, add=[(1, 3)], remove=[(1, 2)]))
    assert state.circuits(0) == {Circuit(0, 1, 3)}
    assert state.peer(0, 2) is None


def test_full_rotation_in_one_request_is_accepted() -> None:
    state = make_state({0: [(1, 2), (3, 4)]})
    state.apply(Reconfiguration.of(0, add=[(1, 3), (2, 4)], remove=[(1, 2), (3, 4)]))
    assert state.circuits(0) == {Circuit(0, 1, 3), Circuit(0, 2, 4)}


def test_rails_are_independent() -> None:
    state = make_state({0: [(1, 2)]})
    state.apply(Reconfiguration.of(1, add=[(1, 2)]))
    assert state.circuits(0) == {Circuit(0, 1, 2)}
    assert state.circuits(1) == {Circuit(1, 1, 2)}


# --- CrossconnectState: rejections -----------------------------------------------------------


def assert_rejected(
    state: CrossconnectState, reconf: Reconfiguration, rail: int, ports: tuple[int, ...]
) -> ReconfigurationRejected:
    """``apply(reconf)`` is rejected naming ``rail`` and ``ports``, and changes nothing."""
    before = snapshot(state)
    with pytest.raises(ReconfigurationRejected) as info:
        state.apply(reconf)
    assert info.value.rail == rail
    assert info.value.ports == ports
    assert f"rail {rail}" in str(info.value)
    assert snapshot(state) == before
    return info.value


def test_reject_port_whose_existing_peer_is_not_removed() -> None:
    state = make_state({0: [(1, 2)]})
    err = assert_rejected(state, Reconfiguration.of(0, add=[(1, 3)]), 0, (1, 2))
    assert "already has peer 2" in err.reason


def test_reject_adding_an_existing_circuit_again() -> None:
    state = make_state({0: [(1, 2)]})
    assert_rejected(state, Reconfiguration.of(0, add=[(1, 2)]), 0, (1, 2))


def test_reject_two_new_circuits_on_one_port() -> None:
    state = make_state()
    err = assert_rejected(state, Reconfiguration.of(0, add=[(1, 2), (2, 3)]), 0, (2,))
    assert "two new circuits" in err.reason


def test_reject_partially_valid_request_changes_nothing() -> None:
    """The valid half of a request (swap 3-4 away) must not be committed when the rest fails."""
    state = make_state({0: [(1, 2), (3, 4)]})
    reconf = Reconfiguration.of(0, add=[(5, 6), (1, 7)], remove=[(3, 4)])
    assert_rejected(state, reconf, 0, (1, 2))


def test_reject_unknown_port_names_only_the_unknown_ports() -> None:
    state = make_state()
    err = assert_rejected(state, Reconfiguration.of(1, add=[(1, 9), (2, 0)]), 1, (0, 9))
    assert "no such port" in err.reason


def test_reject_removing_absent_circuit() -> None:
    state = make_state({0: [(1, 2), (3, 4)]})
    err = assert_rejected(state, Reconfiguration.of(0, remove=[(1, 3)]), 0, (1, 3))
    assert "absent" in err.reason


def test_reject_removing_circuit_that_lives_on_other_rail() -> None:
    state = make_state({0: [(1, 2)]})
    assert_rejected(state, Reconfiguration.of(1, remove=[(1, 2)]), 1, (1, 2))


def test_reject_unknown_rail() -> None:
    state = make_state({0: [(1, 2)]})
    err = assert_rejected(state, Reconfiguration.of(7, add=[(1, 2)]), 7, ())
    assert "no such rail" in err.reason
    with pytest.raises(ReconfigurationRejected):
        state.circuits(7)
    with pytest.raises(ReconfigurationRejected):
        state.peer(7, 1)


def test_rejection_json_names_rail_and_ports() -> None:
    err = ReconfigurationRejected(3, [5, 2, 5], "because")
    assert err.ports == (2, 5)
    assert err.to_json() == {"rail": 3, "ports": [2, 5], "reason": "because",
                             "error": "rail 3, port(s) 2, 5: because"}
    assert isinstance(err, ValueError)


def test_check_alone_never_changes_state() -> None:
    state = make_state({0: [(1, 2)]})
    before = snapshot(state)
    state.check(Reconfiguration.of(0, add=[(3, 4)], remove=[(1, 2)]))
    assert snapshot(state) == before


# --- check_all / diff_to ---------------------------------------------------------------------


def test_check_all_rejects_two_requests_for_one_rail() -> None:
    state = make_state()
    batch = [Reconfiguration.of(0, add=[(1, 2)]), Reconfiguration.of(0, add=[(3, 4)])]
    with pytest.raises(ReconfigurationRejected, match="two requests") as info:
        state.check_all(batch)
    assert info.value.rail == 0


def test_check_all_accepts_one_request_per_rail_and_rejects_any_bad_one() -> None:
    state = make_state({0: [(1, 2)]})
    state.check_all([Reconfiguration.of(0, remove=[(1, 2)]), Reconfiguration.of(1, add=[(1, 2)])])
    with pytest.raises(ReconfigurationRejected) as info:
        state.check_all([Reconfiguration.of(1, add=[(1, 2)]),
                         Reconfiguration.of(0, add=[(1, 3)])])
    assert (info.value.rail, info.value.ports) == (0, (1, 2))


def test_diff_to_is_minimal_and_reaches_target() -> None:
    state = make_state({0: [(1, 2), (3, 4), (5, 6)]})
    target = {Circuit(0, 1, 2), Circuit(0, 3, 5), Circuit(0, 4, 7)}
    diff = state.diff_to(0, target)
    assert diff.rail == 0
    assert diff.remove == {Circuit(0, 3, 4), Circuit(0, 5, 6)}
    assert diff.add == {Circuit(0, 3, 5), Circuit(0, 4, 7)}
    state.apply(diff)
    assert state.circuits(0) == target


def test_diff_to_current_circuits_is_empty() -> None:
    state = make_state({0: [(1, 2)]})
    assert state.diff_to(0, state.circuits(0)).is_empty


# --- property: random request sequences ------------------------------------------------------

pairs = st.tuples(st.integers(0, 9), st.integers(0, 9)).filter(lambda p: p[0] != p[1])
requests = st.tuples(
    st.integers(0, 2),  # rail 2 does not exist
    st.lists(pairs, max_size=3),
    st.lists(pairs, max_size=2),
)


def expected_ok(peers: dict[int, int], known: set[int] | None, req: Reconfiguration) -> bool:
    """Independent oracle: is ``req`` legal against ``peers`` (a rail's peer map)?"""
    if known is None or not req.touched_ports <= known:
        return False
    if any(peers.get(c.port_a) != c.port_b for c in req.remove):
        return False
    after = {p: q for p, q in peers.items()
             if not any(p in c.ports for c in req.remove)}
    added = [p for c in req.add for p in c.ports]
    return len(added) == len(set(added)) and not set(added) & set(after)


@settings(max_examples=200, deadline=None)
@given(st.lists(requests, max_size=25))
def test_random_requests_keep_one_to_one_and_rejections_change_nothing(
    reqs: list[tuple[int, list[tuple[int, int]], list[tuple[int, int]]]],
) -> None:
    state = make_state()
    for rail, add, remove in reqs:
        reconf = Reconfiguration.of(rail, add=add, remove=remove)
        before = snapshot(state)
        known = set(PORTS[rail]) if rail in PORTS else None
        peers = {p: q for p, q in before.get(rail, {}).items() if q is not None}
        ok = expected_ok(peers, known, reconf)
        try:
            state.apply(reconf)
        except ReconfigurationRejected as err:
            assert not ok, f"legal request {reconf} rejected: {err}"
            assert err.rail == rail
            assert set(err.ports) <= reconf.touched_ports | set(peers.values())
            assert snapshot(state) == before
        else:
            assert ok, f"illegal request {reconf} accepted"
        for r in state.rails:
            ends = [p for c in state.circuits(r) for p in c.ports]
            assert len(ends) == len(set(ends)), "a port has two peers"
            for p in state.ports(r):
                q = state.peer(r, p)
                if q is not None:
                    assert q != p and state.peer(r, q) == p


@settings(max_examples=100, deadline=None)
@given(st.permutations(list(range(1, 9))), st.integers(0, 4),
       st.permutations(list(range(1, 9))), st.integers(0, 4))
def test_diff_to_any_matching_reaches_it(
    start: list[int], n_start: int, goal: list[int], n_goal: int
) -> None:
    """From any matching, applying diff_to(target) is accepted and yields exactly target."""
    state = make_state({0: [(start[2 * i], start[2 * i + 1]) for i in range(n_start)]})
    target = {Circuit(0, goal[2 * i], goal[2 * i + 1]) for i in range(n_goal)}
    diff = state.diff_to(0, target)
    assert not diff.add & diff.remove
    state.apply(diff)
    assert state.circuits(0) == target


# --- switching delay -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (0, 0.0), (12, 12.0), (2.5, 2.5), ("7", 7.0), (" 0.25 ", 0.25), ("1e1", 10.0),
        ("3d-mems", 15.0), ("piezo", 25.0), ("liquid-crystal", 100.0), ("robotic", 120000.0),
        ("plzt", 0.00001), ("sip", 0.007), ("rotornet", 0.01),
        ("mems", 15.0), ("3dmems", 15.0), ("3d_mems", 15.0), ("calient", 15.0),
        ("polatis", 25.0), ("lc", 100.0), ("lcos", 100.0), ("liquid_crystal", 100.0),
        ("telescent", 120000.0), (" 3D-MEMS ", 15.0), ("Piezo", 25.0),
    ],
)
def test_resolve_switching_delay(value: float | str, ms: float) -> None:
    got = resolve_switching_delay_ms(value)
    assert isinstance(got, float)
    assert got == pytest.approx(ms)


def test_every_technology_resolves_to_its_table_value() -> None:
    for name, (ms, _radix) in TECHNOLOGIES.items():
        assert resolve_switching_delay_ms(name) == ms


@pytest.mark.parametrize("value", [-1, -0.5])
def test_resolve_switching_delay_rejects_negative_number(value: float) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        resolve_switching_delay_ms(value)


@pytest.mark.parametrize("value", ["-5", " -0.5 "])
def test_resolve_switching_delay_rejects_negative_numeric_string(value: str) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        resolve_switching_delay_ms(value)


@pytest.mark.parametrize("value", [math.nan, "nan"])
def test_resolve_switching_delay_rejects_nan(value: float | str) -> None:
    with pytest.raises(ValueError):
        resolve_switching_delay_ms(value)


@pytest.mark.parametrize("value", ["warp-drive", "", "mems2"])
def test_resolve_switching_delay_unknown_name_lists_known(value: str) -> None:
    with pytest.raises(ValueError) as info:
        resolve_switching_delay_ms(value)
    msg = str(info.value)
    assert repr(value) in msg
    for name in ("3d-mems", "piezo", "liquid-crystal"):
        assert name in msg


def test_the_known_list_names_every_accepted_word() -> None:
    with pytest.raises(ValueError) as info:
        resolve_switching_delay_ms("warp-drive")
    known = str(info.value).split("known: ", 1)[1]
    words = set(re.findall(r"[\w-]+", known)) - {"or", "a", "number", "of", "ms"}
    accepted = set(TECHNOLOGIES) | set(TECHNOLOGY_ALIASES)
    assert words == accepted
    for word in accepted:
        resolve_switching_delay_ms(word)  # each listed word is accepted


def test_parse_delays_takes_what_a_single_delay_takes() -> None:
    assert parse_delays_ms("0, sip,mems ,100,Piezo,") == [0.0, 0.007, 15.0, 100.0, 25.0]


@pytest.mark.parametrize(("text", "wanted"), [
    ("0,sipp", ["item 2 of '0,sipp'", "unknown OCS technology 'sipp'", "sip", "mems",
                "or a number of ms"]),
    ("10,-5", ["item 2 of '10,-5'", ">= 0 ms"]),
    (" , ", ["no delay given", "e.g. 0,10,sip"]),
])
def test_parse_delays_names_the_bad_item_and_the_allowed_words(text: str,
                                                               wanted: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        parse_delays_ms(text)
    for w in wanted:
        assert w in str(info.value)
    assert "could not convert" not in str(info.value)


@pytest.mark.parametrize("value", [True, False])
def test_resolve_switching_delay_rejects_bool(value: bool) -> None:
    with pytest.raises(ValueError, match="number of ms or a technology"):
        resolve_switching_delay_ms(value)


# --- JSON forms of results -------------------------------------------------------------------


def test_apply_result_json_round_trip() -> None:
    res = ApplyResult(2, frozenset({Circuit(2, 3, 1), Circuit(2, 4, 5)}),
                      frozenset({Circuit(2, 1, 4)}), 10.0, 10.25, 10.275)
    data = json.loads(json.dumps(res.to_json()))
    assert data["added"] == [[1, 3], [4, 5]]
    assert data["removed"] == [[1, 4]]
    assert ApplyResult.from_json(data) == res
    assert res.dark_ms == pytest.approx(25.0)


def test_rail_description_json_round_trip() -> None:
    desc = RailDescription(1, (1, 2, 5), 15.0, "electrical")
    data = json.loads(json.dumps(desc.to_json()))
    assert RailDescription.from_json(data) == desc
    del data["mode"]
    assert RailDescription.from_json(data).mode == "ocs"
