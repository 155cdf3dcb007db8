"""The sim engine's physical invariants: random runs keep them, and each check fires.

The checks (:mod:`testbed.simulator.invariants`) run inside every :class:`PlanSimulation`; a
broken invariant fails the run with a :class:`SimulationError` naming it. The tests below break
each one on purpose (a forged decision or ack from the core, a batcher that reorders) and
assert the run fails naming the rail, the ports and the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_programs import Programs, simulation

from controller.batching import Batch, RailBatcher
from controller.core import Ack, Decision, Intent, OpusCore, Output
from controller.job import CommGroup
from controller.ocs import Reconfiguration
from testbed.plan.replay import PlanOp
from testbed.simulator.engine import PlanSimulation, SimulationError
from testbed.simulator.network import EMULATOR_COSTS, IDEAL_COSTS, network_model

IDEAL = network_model(1000, 5, IDEAL_COSTS)
# four single-GPU servers on rail 0, one port each: rank r owns port r + 1
DP = CommGroup("dp", "dp", (0, 1, 2, 3), pairs=((0, 1), (2, 3)))
PP = CommGroup("pp", "pp", (0, 1, 2, 3), pairs=((0, 2), (1, 3)))


def dp_pp_simulation(mode: str = "on-demand") -> PlanSimulation:
    progs = Programs(range(4)).call(DP, 1000).call(PP, 1000)
    return simulation(progs.ops, [DP, PP], network=IDEAL, mode=mode, switching_delay_ms=10,
                      iterations=2)


Forge = Callable[[str, tuple[Any, ...], dict[str, Any], Output], None]


class ForgingCore:
    """The real core; ``forge`` may add to the outputs of its event methods (a broken core)."""

    def __init__(self, core: OpusCore, forge: Forge) -> None:
        self._core = core
        self._forge = forge

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._core, name)
        if name not in ("intent", "complete", "reconfig_done"):
            return method

        def forged(*args: Any, **kwargs: Any) -> Output:
            out: Output = method(*args, **kwargs)
            self._forge(name, args, kwargs, out)
            return out

        return forged


def forge_decision_once(event: str, reconf: Reconfiguration) -> Forge:
    """At the core's first ``event``, a decision 99 (group ``forged``) asking for ``reconf``."""
    done = []

    def forge(name: str, _args: tuple[Any, ...], _kw: dict[str, Any], out: Output) -> None:
        if name == event and not done:
            done.append(True)
            out.decisions.append(Decision(99, "j", "forged", 0, (reconf,), False))

    return forge


def run_forged(sim: PlanSimulation, forge: Forge) -> None:
    sim.core = ForgingCore(sim.core, forge)  # type: ignore[assignment]
    sim.run()


# --------------------------------------------------------------- each check fires

def test_a_request_that_cuts_an_active_circuit_fails_the_run() -> None:
    """At the first completion of the DP call (three members still use its circuits) the core
    also asks to remove circuit 1-2 (ranks 0, 1)."""
    cut = forge_decision_once("complete", Reconfiguration.of(0, remove=[(1, 2)]))
    with pytest.raises(SimulationError, match=r"invariant violated: t=0\.01\d+ s: a request for "
                       r"decision\(s\) 99 \(forged#0\) on rail 0 touches port [12] \(circuit "
                       r"[12]<->[12]\), which call\(s\) dp#0 use"):
        run_forged(dp_pp_simulation(), cut)


@pytest.mark.parametrize(("when", "problem"), [
    ("first intent", r"ranks 0 and 1 have no circuit on rail 0"),
    ("switching intent", r"its circuit 1<->2 on rail 0 \(ranks 0, 1\) is dark"),
])
def test_an_ack_before_the_light_fails_the_run(when: str, problem: str) -> None:
    """The core acknowledges a DP intent at once: before any circuit exists (the first rank to
    ask), or while the circuits switch (the last rank to ask, whose intent started it)."""
    def early_ack(name: str, args: tuple[Any, ...], kw: dict[str, Any], out: Output) -> None:
        if name != "intent":
            return
        intent: Intent = args[0]
        if intent.seq == 0 and intent.group_id == "dp" and (
                intent.rank == 0 if when == "first intent" else bool(out.decisions)):
            out.acks.append(Ack(kw["ref"], "j", intent.rank, "dp", 0, False))

    rank = 0 if when == "first intent" else 3
    with pytest.raises(SimulationError, match=rf"t=0\.000000 s: rank {rank} was acknowledged "
                       rf"for call dp#0 but {problem}"):
        run_forged(dp_pp_simulation(), early_ack)


def test_a_request_that_gives_a_port_two_peers_fails_the_run() -> None:
    """When the DP circuits light, the core also asks for circuit 1-3: port 1 is rank 0's
    only port and already joined to port 2."""
    second_peer = forge_decision_once("reconfig_done", Reconfiguration.of(0, add=[(1, 3)]))
    with pytest.raises(SimulationError, match=r"t=0\.010000 s: a request for decision\(s\) 99 "
                       r"\(forged#0\) breaks the one-to-one rule: rail 0, port\(s\) 1, 2: port 1 "
                       r"already has peer 2"):
        run_forged(dp_pp_simulation(), second_peer)


class SwappingBatcher(RailBatcher):
    """Holds the first decision back and submits it after the second one (not FCFS)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Decision] = []
        self.swapped = False

    def submit(self, decision: Decision) -> list[Batch]:
        if not self.swapped and not self.held:
            self.held.append(decision)
            return []
        batches = super().submit(decision)
        if self.held:
            self.swapped = True
            batches += super().submit(self.held.pop())
        return batches


def test_requests_out_of_decision_order_fail_the_run() -> None:
    """Two DP pairs switch rail 0 at t=0: decision 1 (dp0) waits behind decision 2 (dp1)."""
    groups = [CommGroup("dp0", "dp", (0, 1)), CommGroup("dp1", "dp", (2, 3)),
              CommGroup("pp0", "pp", (0, 2)), CommGroup("pp1", "pp", (1, 3))]
    progs = Programs(range(4))
    for g in groups:
        progs.call(g, 1000)
    sim = simulation(progs.ops, groups, network=IDEAL, mode="on-demand", switching_delay_ms=10,
                     iterations=1)
    sim._batcher = SwappingBatcher()
    with pytest.raises(SimulationError, match=r"t=0\.010000 s: rail 0 got decision 1 "
                       r"\(dp0#0\) after decision 2: the core made them in the other order"):
        sim.run()


def test_the_unbroken_runs_pass_the_checks() -> None:
    """The runs above, without forgery, complete (the checks do not fire by themselves)."""
    for mode in ("on-demand", "provisioning", "degree-aware"):
        records, _events = dp_pp_simulation(mode).run()
        assert sum(r["ev"] == "finished" for r in records) == 4


# ------------------------------------------------------------------ property test

@st.composite
def random_runs(draw: st.DrawFn) -> tuple[dict[int, list[PlanOp]], list[CommGroup],
                                           dict[str, Any]]:
    """Ranks on 1-2 rails; phases of disjoint ring groups on a rail (one parallelism each);
    a random order of phases that every member follows (as NCCL requires); compute gaps; a
    random mode, switching time, jitter and fixed costs."""
    gpus = draw(st.sampled_from([1, 2]))
    k = draw(st.sampled_from([1, 2]))
    n_ranks = gpus * draw(st.integers(3, 6))
    on_rail = {rail: [r for r in range(n_ranks) if r % gpus == rail] for rail in range(gpus)}
    phases: list[list[CommGroup]] = []
    for _ in range(draw(st.integers(1, 4))):
        ranks = draw(st.permutations(on_rail[draw(st.sampled_from(sorted(on_rail)))]))
        axis = draw(st.sampled_from(["dp", "pp", "tp"]))
        phase = []
        while len(ranks) >= 2:
            size = draw(st.integers(2, min(len(ranks), 3) if k == 2 else 2))  # 3: 2 ports
            name = f"{axis}{len(phases)}-{len(phase)}"
            phase.append(CommGroup(name, axis, tuple(ranks[:size])))
            ranks = ranks[size:]
        phases.append(phase)
    progs = Programs(range(n_ranks))
    for r in range(n_ranks):
        progs.compute(r, 0.0)  # every rank has an op, even outside every group
    for phase in draw(st.lists(st.sampled_from(phases), min_size=1, max_size=6)):
        for g in draw(st.permutations(phase)):
            for r in g.ranks:
                progs.compute(r, draw(st.sampled_from([0.0, 0.002, 0.02])))
            progs.call(g, draw(st.sampled_from([1, 1000, 100_000])))
    opts = {"mode": draw(st.sampled_from(["on-demand", "provisioning", "degree-aware"])),
            "switching_delay_ms": draw(st.sampled_from([0.0, 1.0, 15.0])),
            "jitter_ms": draw(st.sampled_from([0.0, 2.0])),
            "network": network_model(1000, 5, draw(st.sampled_from([IDEAL_COSTS,
                                                                   EMULATOR_COSTS]))),
            "iterations": draw(st.integers(1, 4)), "ports_per_rank": k,
            "gpus_per_server": gpus, "seed": draw(st.integers(0, 3))}
    return progs.ops, [g for phase in phases for g in phase], opts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_runs())
def test_random_runs_keep_the_invariants_and_deliver_every_byte(
        run: tuple[dict[int, list[PlanOp]], list[CommGroup], dict[str, Any]]) -> None:
    """No active circuit is ever cut (nor any other invariant broken: the engine checks them
    all on the way), every call is acknowledged once and every byte arrives."""
    programs, groups, opts = run
    sim = simulation(programs, groups, **opts)
    records, _events = sim.run()  # raises SimulationError on a violation or a deadlock
    calls = [r for r in records if r["ev"] == "call"]
    n_calls = sum(op.is_call for ops in programs.values() for op in ops) * opts["iterations"]
    assert len(calls) == n_calls == sim.core.counters["acks"]
    assert all(c["received"] == c["expected"] and c["sent"] == c["wire_bytes"] for c in calls)
    assert sum(r["ev"] == "finished" for r in records) == len(programs)
