"""The switching-model interface (controller/switching.py), driven through the core with the toy
model of docs/switching-models.md (static_once.py): registration, asks, light, completions,
failures and lost ranks reach a model that sees only its BookView."""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
from static_once import StaticOnce
from test_controller_core import ask, light, line_job, rails_for

from controller.core import Decision, OpusCore, Output
from controller.job import CommGroup, JobSpec
from controller.ocs import ApplyResult, Circuit
from controller.switching import BookView, SwitchingModel
from testbed.simulator import engine
from testbed.simulator.network import IDEAL_COSTS, network_model

ROOT = Path(__file__).resolve().parents[2]


def chain_job() -> JobSpec:
    """4 ranks on rail 0 with 2 ports each: a, b and d form a chain 0-1-2-3 (degree <= 2)."""
    return line_job(k=2, groups=[CommGroup("a", "dp", (0, 1)), CommGroup("b", "pp", (1, 2)),
                                 CommGroup("d", "ep", (2, 3))])


def static_core(job: JobSpec) -> tuple[OpusCore, Output]:
    core = OpusCore(rails_for(job), model=StaticOnce)
    return core, core.register_job(job, 0.0)


def lit_at(core: OpusCore, dec: Decision, now: float) -> Output:
    """The driver lit ``dec`` at ``now``: the core's answer alone."""
    res = [ApplyResult(rc.rail, rc.add, rc.remove, now, now, now) for rc in dec.reconfs]
    return core.reconfig_done(dec.decision_id, res, now)


def test_the_toy_model_fits_the_protocol_and_sees_only_its_view() -> None:
    core, _ = static_core(chain_job())
    model: SwitchingModel = StaticOnce(core._view())  # (mypy checks the protocol here)
    assert isinstance(model.view, BookView)  # type: ignore[attr-defined]
    assert core.counters is model.view.counters  # type: ignore[attr-defined]
    assert model.view.jobs["j"].spec.job_id == "j"  # type: ignore[attr-defined]


def test_registration_lights_every_circuit_once_and_calls_never_switch() -> None:
    core, out = static_core(chain_job())
    (dec,) = out.decisions
    assert [e["event"] for e in out.events] == ["job_registered", "decision", "reconfig_start"]
    (rc,) = dec.reconfs  # rank r owns ports 2r+1, 2r+2: the chain takes one port per pair end
    assert rc.add == {Circuit(0, 1, 3), Circuit(0, 4, 5), Circuit(0, 6, 7)} and not rc.remove
    assert ask(core, 0, "a").acks == [] and ask(core, 1, "a").acks == []  # dark: they wait
    lit = light(core, out, 0.01)
    assert sorted(a.rank for a in lit.acks) == [0, 1] and all(a.reconfigured for a in lit.acks)
    assert core.active_circuits() == rc.add and core.dark_ports() == frozenset()
    for rank in (0, 1):
        core.complete("j", rank, "a", 0, 0.02)
    for seq, (g, ranks) in enumerate([("b", (1, 2)), ("d", (2, 3)), ("a", (0, 1))]):
        got = Output()
        for r in ranks:
            got.extend(ask(core, r, g, seq=1 if g == "a" else 0, now=0.1 + seq))
        assert sorted(a.rank for a in got.acks) == list(ranks) and not got.decisions
        assert not any(a.reconfigured for a in got.acks)
        for r in ranks:
            done = core.complete("j", r, g, 1 if g == "a" else 0, 0.2 + seq)
        assert done.events[-1]["event"] == "collective_done"
    assert core.counters["decisions"] == 1 and core.counters["acks"] == 8
    assert core.state.circuits(0) == rc.add and core.pending() == []


def test_a_job_that_needs_more_circuits_than_ports_is_refused_and_nothing_changes() -> None:
    job = line_job(k=1)  # rank 1 is in a, b and c: three circuits on one port
    core, out = static_core(job)
    (rej,) = out.rejects
    assert rej.code == "bad_job" and "rank 1 has no port left on rail 0" in rej.message
    assert core.job("j") is None and not out.decisions and core.state.circuits(0) == set()


def test_a_failed_light_rejects_the_waiting_calls_and_the_later_ones() -> None:
    core, out = static_core(chain_job())
    (dec,) = out.decisions
    ask(core, 0, "a")
    got = ask(core, 1, "a")
    assert not got.acks and core._model.waiting  # queued for the light
    failed = core.reconfig_failed(dec.decision_id, "port 3 stuck", 0.01)
    assert {r.ref for r in failed.rejects} == {(0, "a"), (1, "a")}
    assert {r.code for r in failed.rejects} == {"reconfig_failed"}
    assert core.state.circuits(0) == set() and not core._model.waiting  # undone, dropped
    ask(core, 1, "b", now=0.1)
    later = ask(core, 2, "b", now=0.1)
    assert [r.code for r in later.rejects] == ["reconfig_failed", "reconfig_failed"]


def test_a_rank_lost_while_its_call_waits_withdraws_the_call_from_the_model() -> None:
    core, out = static_core(chain_job())
    ask(core, 0, "a")
    ask(core, 1, "a")
    lost = core.rank_lost("j", 1, 0.005)
    assert [(r.ref, r.code) for r in lost.rejects] == [((0, "a"), "peer_lost")]
    assert not core._model.waiting and core.pending() == []
    lit = lit_at(core, out.decisions[0], 0.01)
    assert not lit.acks and [e["event"] for e in lit.events] == ["reconfig_end"]


def test_unregistering_forgets_the_job_and_its_light_is_ignored() -> None:
    core, out = static_core(chain_job())
    ask(core, 0, "a")
    ask(core, 1, "a")
    gone = core.unregister_job("j", 0.005)
    assert sorted(r.code for r in gone.rejects) == ["job_unregistered"] * 2
    assert not core._model.waiting
    lit = lit_at(core, out.decisions[0], 0.01)
    assert not lit.acks and [e["event"] for e in lit.events] == ["reconfig_end"]


def test_the_doc_shows_the_toy_model_as_it_is_tested() -> None:
    """docs/switching-models.md prints static_once.py whole: the example cannot drift."""
    doc = (ROOT / "docs" / "switching-models.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    source = (Path(__file__).parent / "static_once.py").read_text()
    assert source in blocks, "docs/switching-models.md: copy tests/controller/static_once.py"


def _sim_programs() -> Any:  # tests/testbed is not a package: load its helper by path
    spec = importlib.util.spec_from_file_location(
        "sim_programs", ROOT / "tests" / "testbed" / "sim_programs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("model", [None, StaticOnce], ids=["port-exact", "static-once"])
def test_the_simulator_runs_a_model_passed_to_its_core(monkeypatch: pytest.MonkeyPatch,
                                                       model: type[StaticOnce] | None) -> None:
    """The same 4-rank DP/PP program, 3 iterations, K = 2, 10 ms switches, on the sim backend
    (its invariant checker on: one-to-one, lit circuits under every acked call): port-exact
    switches between the phases, static-once once before the first call."""
    sp = _sim_programs()
    monkeypatch.setattr(engine, "OpusCore", functools.partial(OpusCore, model=model))
    dp = CommGroup("dp", "dp", (0, 1, 2, 3), pairs=((0, 1), (2, 3)))
    pp = CommGroup("pp", "pp", (0, 1, 2, 3), pairs=((0, 2), (1, 3)))
    progs = sp.Programs(range(4)).call(dp, 1000).call(pp, 1000)
    sim = sp.simulation(progs.ops, [dp, pp], network=network_model(1000, 5, IDEAL_COSTS),
                        mode="on-demand", switching_delay_ms=10, iterations=3,
                        ports_per_rank=2)
    records, events = sim.run()  # raises SimulationError on a broken invariant or a deadlock
    assert sim.core.counters["acks"] == 24
    t_end_s = max(r["t"] for r in records if "t" in r)
    switched = [e["t_s"] for e in events if e["event"] == "decision"]
    if model is StaticOnce:
        assert switched == [0.0]  # at registration, before any intent
        assert sim.core.counters["reconfigurations"] == 1
    else:
        assert len(switched) == 6  # dp, pp: each iteration switches twice
    # every switch is exposed (nothing overlaps it); the transfers take 78 us in all
    assert round(t_end_s, 3) == 0.010 * len(switched)
