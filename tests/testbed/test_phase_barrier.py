"""The artifact shim's phase barrier (``ocs.rail_state_phase_barrier``, sim, on demand)."""

from __future__ import annotations

from pathlib import Path

from testbed.experiment.config import load_experiment, parse_experiment
from testbed.experiment.prepare import prepare
from testbed.plan.phasebarrier import phase_end_calls
from testbed.simulator.run import build_simulation

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(barrier: bool) -> tuple[object, list[dict[str, object]]]:
    cfg = load_experiment(EXAMPLES / "tiny.yaml").replace(
        semantics="rail-state", mode="on-demand", switching_delay=50.0,
        rail_state_phase_barrier=barrier)
    prep = prepare(cfg, check_capacity=False)
    sim = build_simulation(prep)
    records, _events = sim.run()
    return sim, records


def test_no_call_starts_while_a_phase_end_runs() -> None:
    """With the barrier, a rank starts no call between a phase's last call's ack and its end;
    the tiny job holds some starts and every rank finishes, with or without it."""
    sim, records = _run(True)
    assert sum(1 for r in records if r["ev"] == "finished") == len(sim.ranks)  # type: ignore[attr-defined]
    barrier = sim._barrier  # type: ignore[attr-defined]
    assert barrier is not None and not barrier.holder and barrier.holds > 0
    calls = [r for r in records if r["ev"] == "call"]
    for rank, ends in barrier.ends.items():
        mine = [r for r in calls if r["rank"] == rank]
        for end in (r for r in mine if r["i"] in ends):
            assert not [r for r in mine if end["t_ack"] < r["t_intent"] < end["t_end"]]
    _sim, free = _run(False)
    assert sum(1 for r in free if r["ev"] == "finished") == len(sim.ranks)  # type: ignore[attr-defined]


def test_phase_ends_are_the_calls_before_a_family_change() -> None:
    cfg = load_experiment(EXAMPLES / "tiny.yaml").replace(semantics="rail-state",
                                                         mode="on-demand")
    prep = prepare(cfg, check_capacity=False)
    for ops in prep.plan.programs.values():
        ends = phase_end_calls(ops)
        assert ends
        for i in ends:
            assert ops[i].is_call


def test_option_parses_and_defaults_off() -> None:
    base = ("name: t\ncluster: {servers: 4, gpus_per_server: 1}\nworkload:\n  model: llama3-8b\n"
            "  parallelism: {tp: 1, fsdp: 2, pp: 2}\nocs:\n  semantics: rail-state\n")
    assert parse_experiment(base, "x.yaml").rail_state_phase_barrier is False
    cfg = parse_experiment(base + "  rail_state_phase_barrier: true\n", "x.yaml")
    assert cfg.rail_state_phase_barrier is True
    assert cfg.to_json()["rail_state_phase_barrier"] is True
