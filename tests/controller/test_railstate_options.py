"""The rail-state options where the artifact's code and the physics differ (issue 24): the
shim's ack timeout (``ocs.rail_state_ack_timeout_s``) and the controller's per-rank
serialisation of requests (``ocs.rail_state_serialize_per_rank``).

The core harness is test_railstate.py's setting: one rail, two stages, ranks 0, 1 in stage 0
and 2, 3 in stage 1; A = fsdp {0, 1}, B = fsdp {2, 3}, X = p2p 0-2; 100 ms per bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from clocked_core import ClockedCore

from controller.core import Ack, CoreConfig, Intent, OpusCore
from controller.job import CommGroup, JobSpec, rail_job_ports
from controller.ocs import RailDescription
from controller.railstate import shadow_rails
from testbed.experiment.config import load_experiment, parse_experiment
from testbed.experiment.prepare import prepare
from testbed.simulator.run import build_simulation
from workloads.errors import WorkloadConfigError

DELAY_S = 0.1
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GROUPS = (CommGroup("A", "fsdp", (0, 1)), CommGroup("B", "fsdp", (2, 3)),
          CommGroup("X", "pp", (0, 2), "pairs"))
MEMBERS = {g.group_id: g.ranks for g in GROUPS}


class _Clocked(ClockedCore):
    """A rail-state core on a virtual clock: lights after the delay, acks recorded."""

    def __init__(self, serialize: bool) -> None:
        rails = [RailDescription(0, (1, 2, 3, 4), 0.0, "electrical")] + [
            RailDescription(s, (1, 2, 3), DELAY_S * 1e3, "ocs") for s in shadow_rails(1, 2)]
        super().__init__(OpusCore(rails, CoreConfig(semantics="rail-state",
                                               rail_state_serialize_per_rank=serialize)),
                         DELAY_S)
        job = JobSpec("j", rail_job_ports(range(4), 1, 1), {g.group_id: g for g in GROUPS},
                      {0: 0, 1: 0, 2: 1, 3: 1})
        self.core.register_job(job, 0.0)
        self.acks: dict[tuple[str, int, int], float] = {}  # (group, seq, rank) -> t

    def record_ack(self, ack: Ack) -> None:
        self.acks[(ack.group_id, ack.seq, ack.rank)] = self.now

    def ask(self, t_s: float, group: str, seq: int, ranks: tuple[int, ...] = ()) -> None:
        self.run_until(t_s)
        for rank in ranks or MEMBERS[group]:
            self.take(self.core.intent(Intent("j", rank, group, seq), self.now, ref=rank))


def test_serialised_rank_waits_for_its_switching_request() -> None:
    """Rank 2's X completes the gathering and switches bits 0, 1 (0 -> 100 ms); its B intent
    at 20 ms is read only at 100 ms: B then clears bit 1 (100 -> 200 ms). Without
    serialisation B is served at 20 ms, joins X's switch of bit 0 and is acked at 100 ms."""
    times = {}
    for serialize in (False, True):
        c = _Clocked(serialize)
        c.ask(0.0, "X", 0)  # rank 0, then rank 2: rank 2's request starts the switch
        c.ask(0.02, "B", 0)  # rank 2 (busy when serialised), then rank 3
        c.run_until()
        times[serialize] = (c.acks[("X", 0, 2)], c.acks[("B", 0, 2)], c.acks[("B", 0, 3)])
        held = [e for e in c.events if e["event"] == "request_held"]
        if serialize:
            assert [(e["rank"], e["group"], e["t_s"]) for e in held] == [(2, "B", 0.02)]
            assert c.core.counters["rail_state_held_requests"] == 1
        else:
            assert not held
    assert times[False] == pytest.approx((0.1, 0.1, 0.1))
    assert times[True] == pytest.approx((0.1, 0.2, 0.2))


def test_serialisation_holds_only_the_rank_that_started_the_switch() -> None:
    """Rank 0 asked X first (its request did not start the switch): its A intent is read at
    once, and A (requested 10 against completed 00: bit 1, which X is switching to 1) joins X's
    switch and is acked with it at 100 ms."""
    c = _Clocked(True)
    c.ask(0.0, "X", 0)
    c.ask(0.02, "A", 0)
    c.run_until()
    assert c.acks[("A", 0, 0)] == pytest.approx(0.1)
    assert c.acks[("A", 0, 1)] == pytest.approx(0.1)
    assert not [e for e in c.events if e["event"] == "request_held"]


def test_serialisation_needs_rail_state() -> None:
    with pytest.raises(ValueError, match="rail_state_serialize_per_rank is a rail-state"):
        CoreConfig(semantics="port-exact", rail_state_serialize_per_rank=True)
    assert not CoreConfig.for_mode("on-demand", "port-exact", "join",
                                   True).rail_state_serialize_per_rank


def _tiny_rail_state(timeout_s: float | None) -> Any:
    cfg = load_experiment(EXAMPLES / "tiny.yaml").replace(
        semantics="rail-state", mode="on-demand", switching_delay=2000.0,
        rail_state_ack_timeout_s=timeout_s)
    sim = build_simulation(prepare(cfg, check_capacity=False))
    records, _events = sim.run()
    return sim, records


def test_ack_timeout_lets_a_rank_go_on_without_the_light() -> None:
    """At 2 s per switch and a 0.5 s timeout every switching call goes on after 0.5 s; its
    ack comes later (late) and the run still finishes; without the timeout, calls wait."""
    sim, records = _tiny_rail_state(0.5)
    calls = [r for r in records if r["ev"] == "call"]
    timeouts = [r for r in records if r["ev"] == "ack_timeout"]
    late = {(r["rank"], r["group"], r["seq"]): r["t"] for r in records if r["ev"] == "late_ack"}
    assert timeouts and sim.counters["ack_timeouts"] == len(timeouts)
    assert sim.counters["late_acks"] == len(late) == len(timeouts)
    for r in timeouts:  # the rank went on before the light reached it
        assert late[(r["rank"], r["group"], r["seq"])] > r["t"]
    went_on = {(r["rank"], r["it"], r["i"]) for r in timeouts}
    assert went_on == {(r["rank"], r["it"], r["i"]) for r in calls if r.get("ack_timeouts")}
    assert sum(r.get("ack_timeouts", 0) for r in calls) == len(timeouts)
    assert max(r["t_ack"] - r["t_intent"] for r in calls) <= 0.5 + 1e-9
    assert sum(1 for r in records if r["ev"] == "finished") == len(sim.ranks)
    _sim, waited = _tiny_rail_state(None)
    assert max(r["t_ack"] - r["t_intent"] for r in waited if r["ev"] == "call") > 1.9
    assert not [r for r in waited if r["ev"] == "ack_timeout"]


BASE = """name: t
cluster: {servers: 4, gpus_per_server: 1}
workload:
  model: llama3-8b
  parallelism: {tp: 1, fsdp: 2, pp: 2}
ocs:
  semantics: rail-state
"""


@pytest.mark.parametrize(("line", "key", "words"), [
    ("rail_state_ack_timeout_s: 0", "ocs.rail_state_ack_timeout_s", "positive"),
    ("rail_state_ack_timeout_s: soon", "ocs.rail_state_ack_timeout_s", "'soon'"),
    ("rail_state_serialize_per_rank: 1", "ocs.rail_state_serialize_per_rank", "true or false"),
])
def test_bad_option_values_name_the_key(line: str, key: str, words: str) -> None:
    with pytest.raises(WorkloadConfigError) as err:
        parse_experiment(BASE + f"  {line}\n", "x.yaml")
    assert key in str(err.value) and words in str(err.value)


def test_options_parse_with_physical_defaults() -> None:
    cfg = parse_experiment(BASE, "x.yaml")
    assert cfg.rail_state_ack_timeout_s is None and cfg.rail_state_serialize_per_rank is False
    cfg = parse_experiment(BASE + "  rail_state_ack_timeout_s: 10\n"
                           "  rail_state_serialize_per_rank: true\n", "x.yaml")
    assert cfg.rail_state_ack_timeout_s == 10.0 and cfg.rail_state_serialize_per_rank is True
    assert cfg.to_json()["rail_state_ack_timeout_s"] == 10.0
    assert parse_experiment(BASE + "  rail_state_ack_timeout_s: null\n",
                            "x.yaml").rail_state_ack_timeout_s is None
