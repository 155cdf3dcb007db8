"""The static plane's paths, shared by both backends (:mod:`testbed.plan.planes`,
:func:`controller.planes.relay.path_table`), and the emulated run's pure parts
(:mod:`testbed.emulated.planes`): each rank's stations, the circuits to install, the checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_programs import Programs

from controller.job import CommGroup
from controller.ocs import RailDescription, Reconfiguration
from controller.planes.relay import path_table, stations
from testbed.emulated.planes import (
    HeldRailsDriver,
    circuit_problems,
    install_reconfigurations,
    plane_stats,
    rank_relays,
)
from testbed.plan.planes import relay_bytes, relayed_share, server_demand, static_plan
from testbed.plan.rankplan import RankPlan, ReplayPart

CHUNK = 1000
# four servers of two GPUs, one port each: two switches, (rail 0, port 0) and (rail 1, port 0);
# rank 0 (server 0, rail 0) talks to rail 0's GPU of every other server
P02 = CommGroup("p02", "pp", (0, 2), pairs=((0, 2),))
P04 = CommGroup("p04", "pp", (0, 4), pairs=((0, 4),))
P06 = CommGroup("p06", "pp", (0, 6), pairs=((0, 6),))
P46 = CommGroup("p46", "pp", (4, 6), pairs=((4, 6),))


def star() -> dict:
    """Rank 0 with every other server's rail-0 GPU, and servers 2 and 3 with each other."""
    progs = (Programs(range(8)).call(P02, 3 * CHUNK).call(P04, CHUNK).call(P06, CHUNK)
             .call(P46, CHUNK))
    for r in (1, 3, 5, 7):
        progs.compute(r, 1e-6)
    return progs.ops


def test_the_star_takes_one_relay_server_and_nvlink_legs() -> None:
    ops = star()
    assert server_demand(ops, 2) == {(0, 1): 6 * CHUNK, (0, 2): 2 * CHUNK, (0, 3): 2 * CHUNK,
                                     (2, 3): 2 * CHUNK}
    plan = static_plan(ops, 2, 1, 4)
    # heaviest first on rail 0's switch (0-1, and 2-3 beside it); rail 1's joins 0 and 2
    assert plan.topology == {(0, 0): {0: 1, 1: 0, 2: 3, 3: 2}, (1, 0): {0: 2, 2: 0}}
    assert plan.stations("p02:0", 0, 2) == [0, 2]  # the direct circuit on its own rail
    # server 0 -> 2 on rail 1's circuit: over NVLink to rank 1, the circuit to rank 5, NVLink
    assert plan.stations("p04:0", 0, 4) == [0, 1, 5, 4]
    assert plan.stations("p04:0", 4, 0) == [4, 5, 1, 0]
    # server 0 -> 3: relayed by server 2 (rank 5 then rank 4), then rail 0's circuit 2-3
    assert plan.stations("p06:0", 0, 6) == [0, 1, 5, 4, 6]
    assert relay_bytes(ops, plan) == {1: 4 * CHUNK, 5: 4 * CHUNK, 4: 2 * CHUNK}
    assert plan.stations("p46:0", 4, 6) == [4, 6]
    assert relayed_share(ops, plan) == pytest.approx(2 / 12)  # 0 <-> 6 only: two circuits


def test_path_table_balances_parallel_circuits_and_keeps_a_tie_on_the_own_rail() -> None:
    both = {0: 1, 1: 0}  # two servers of three GPUs, every switch joins them
    config = {(0, 0): both, (1, 0): both, (2, 0): both}
    # rank 1 (rail 1) first: its own rail's circuit; rank 0 then takes rail 0's, equal load
    table = path_table(config, {(1, 4): 5.0, (0, 3): 5.0, (2, 5): 1.0}, 3)
    assert table[(1, 4)] == [((1, 0), 0, 1)]
    assert table[(0, 3)] == [((0, 0), 0, 1)]
    assert table[(2, 5)] == [((2, 0), 0, 1)]
    # a fourth transfer from rank 0 goes where the fewest bytes are, off its own rail
    spread = path_table(config, {(0, 3): 9.0, (1, 4): 8.0, (2, 5): 7.0, (0, 5): 6.0}, 3)
    assert [spread[p][0][0] for p in ((0, 3), (1, 4), (2, 5))] == [(0, 0), (1, 0), (2, 0)]
    assert spread[(0, 5)] == [((2, 0), 0, 1)]  # 7 bytes there, 8 and 9 on the others
    assert path_table(config, {(0, 1): 1.0}, 3) == {}  # inside a server: no circuit
    with pytest.raises(ValueError, match="no path of circuits from rank 0"):
        path_table({(0, 0): both}, {(0, 2): 1.0}, 1)


def test_stations_refuse_a_path_that_does_not_join_the_ranks() -> None:
    assert stations([((1, 0), 0, 2)], 0, 4, 2) == [0, 1, 5, 4]
    with pytest.raises(ValueError, match="does not end at rank 6's server"):
        stations([((1, 0), 0, 2)], 0, 6, 2)


def test_each_rank_gets_its_stations_as_addresses(tmp_path: Path) -> None:
    ops = star()
    plan = static_plan(ops, 2, 1, 4)
    relays = rank_relays(plan, ops, lambda r: f"10.0.0.{r}", 7100, tmp_path)
    assert relays[0].routes == {
        "p04:0": {4: (str(tmp_path / "r1.sock"), ("10.0.0.5", 7100),
                      str(tmp_path / "r4.sock"))},
        "p06:0": {6: (str(tmp_path / "r1.sock"), ("10.0.0.5", 7100),
                      str(tmp_path / "r4.sock"), ("10.0.0.6", 7100))}}
    assert relays[2].routes == {}  # straight to rank 0 on rail 0's circuit
    assert relays[0].scale_up == str(tmp_path / "r0.sock")
    # through the rank plan's JSON and back
    part = ReplayPart("10.0.0.0", 7100, 1, tuple(ops[0]), **relays[0].replay_fields())
    plan_json = RankPlan(0, "j", None, {}, "r.jsonl", 5.0, 30.0, replay=part).to_json()
    assert RankPlan.from_json(plan_json).replay == part


def test_the_circuits_installed_per_rail() -> None:
    plan = static_plan(star(), 2, 1, 4)
    reconfs = install_reconfigurations(plan, lambda rank, k: 100 + rank)
    assert reconfs == [Reconfiguration.of(0, add=[(100, 102), (104, 106)]),
                       Reconfiguration.of(1, add=[(101, 105)])]


FLOWS = ["priority=0 actions=drop",
         "priority=100,in_port=1 actions=output:2", "priority=100,in_port=2 actions=output:1"]


def test_circuit_problems_name_what_breaks_one_to_one() -> None:
    assert circuit_problems({0: FLOWS}) == []
    bad = [*FLOWS, "priority=100,in_port=3 actions=output:2"]
    problems = circuit_problems({0: bad})
    assert any("ports 1 and 3 both send to 2" in p for p in problems), problems
    assert any("circuit 3->2 has no way back" in p for p in problems), problems


def test_plane_stats_compare_the_relays_counts_with_the_plan() -> None:
    ops = star()
    plan = static_plan(ops, 2, 1, 4)
    ok = [{"ev": "finished", "rank": r, "relay": {"forwarded_bytes": n * 2, "errors": []}}
          for r, n in relay_bytes(ops, plan).items()]
    flows = {0: FLOWS, 1: []}
    stats = plane_stats(plan, ops, 2, ok, 1, flows, flows)
    assert stats["problems"] == [] and stats["one_to_one"]
    assert stats["relay_forwarded_bytes"] == stats["relay_forwarded_bytes_planned"] == 20 * CHUNK
    short = [dict(r, relay={"forwarded_bytes": 1, "errors": []}) if r["rank"] == 4 else r
             for r in ok]
    changed = {0: FLOWS[:1], 1: []}
    stats = plane_stats(plan, ops, 2, short, 1, flows, changed)
    assert "rank 4 forwarded 1 bytes, the plan 4000" in stats["problems"]
    assert "the bridges' flows changed during the run" in stats["problems"]
    assert stats["reconfigured_during_run"]


class _Rails:
    def describe(self) -> list[RailDescription]:
        return [RailDescription(0, (1, 2), 1.0)]


def test_the_core_sees_packet_rails_and_cannot_switch() -> None:
    held = HeldRailsDriver(_Rails())  # type: ignore[arg-type]
    assert [r.mode for r in held.describe()] == ["electrical"]
    assert held.apply_many([Reconfiguration.of(0)]) == []
    with pytest.raises(RuntimeError, match="Opus switches nothing"):
        held.apply_many([Reconfiguration.of(0, add=[(1, 2)])])
