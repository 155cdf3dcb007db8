"""The core with the simulated OCS under a virtual clock: invariants, provisioning, degree."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.clock import VirtualClock
from controller.core import CoreConfig
from controller.drivers.sim import SimOcsDriver
from controller.job import CommGroup, JobSpec
from controller.ocs import Reconfiguration, ReconfigurationRejected
from controller.profile import CallProfile, CallSignature
from controller.simulate import Call, Compute, Op, Simulation

# Llama3-like layout on one rail: 4 servers, DP pairs {0,1},{2,3}, PP pairs {0,2},{1,3}
GROUPS = [CommGroup("dp0", "dp", (0, 1)), CommGroup("dp1", "dp", (2, 3)),
          CommGroup("pp0", "pp", (0, 2)), CommGroup("pp1", "pp", (1, 3))]


def dp_pp_programs(window_s: float, call_s: float = 0.01) -> dict[int, list[Op]]:
    progs: dict[int, list[Op]] = {}
    for r in range(4):
        dp, pp = ("dp0" if r < 2 else "dp1"), ("pp0" if r % 2 == 0 else "pp1")
        progs[r] = [Call(dp, "allgather", 957 << 20, call_s, "dp"), Compute(window_s),
                    Call(pp, "send", 64 << 20, call_s, "pp"), Compute(window_s)]
    return progs


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("config", [CoreConfig(), CoreConfig(provisioning=True),
                                    CoreConfig(degree_aware=True),
                                    CoreConfig(provisioning=True, degree_aware=True)])
def test_dp_pp_runs_clean(k: int, config: CoreConfig) -> None:
    job = JobSpec.rail_optimized("j", 4, 1, k, GROUPS)
    res = Simulation(job, dp_pp_programs(0.05), iterations=4, config=config,
                     switching_delay=20).run()
    assert res.violations == []
    assert res.counters["acks"] == 32


def test_provisioning_hides_switching_when_the_window_is_longer() -> None:
    job = JobSpec.rail_optimized("j", 4, 1, 1, GROUPS)
    delay_ms, window_s = 25.0, 0.05
    on_demand = Simulation(job, dp_pp_programs(window_s), iterations=4,
                           switching_delay=delay_ms).run()
    prov = Simulation(job, dp_pp_programs(window_s), iterations=4,
                      config=CoreConfig(provisioning=True), switching_delay=delay_ms).run()
    assert on_demand.violations == [] and prov.violations == []
    for it in (1, 2, 3):
        assert all(w == pytest.approx(delay_ms / 1e3) for w in on_demand.waits(it))
    # iteration 0 is profiled; from then on every switch happens inside the window
    assert all(w == pytest.approx(0.0, abs=1e-9) for w in prov.waits(2) + prov.waits(3))
    assert prov.counters["speculative_decisions"] > 0
    # a window shorter than the switching time is only partly hidden
    short = Simulation(job, dp_pp_programs(0.01), iterations=3,
                       config=CoreConfig(provisioning=True), switching_delay=delay_ms).run()
    assert all(w == pytest.approx(0.015) for w in short.waits(2))


def test_misprediction_falls_back_to_on_demand_safely() -> None:
    job = JobSpec.rail_optimized("j", 4, 1, 1, GROUPS)

    def liar(rank: int, profile: CallProfile) -> CallSignature | None:
        nxt = profile.predict_next()
        if nxt is None:
            return None
        wrong = {"dp0": "pp0", "pp0": "dp0", "dp1": "pp1", "pp1": "dp1"}[nxt.group_id]
        if rank not in job.groups[wrong].ranks:
            wrong = {"pp0": "pp1", "pp1": "pp0", "dp0": "dp1", "dp1": "dp0"}[wrong]
        return CallSignature(wrong, "x", 1)

    res = Simulation(job, dp_pp_programs(0.05), iterations=4,
                     config=CoreConfig(provisioning=True), switching_delay=20,
                     predictor=liar).run()
    assert res.violations == []
    assert res.counters["acks"] == 32
    assert all(w <= 0.02 + 1e-9 for w in res.waits())  # never worse than on-demand


def test_degree_aware_avoids_reconfiguration_where_ports_allow() -> None:
    counts = {}
    for k in (1, 2):
        for da in (False, True):
            job = JobSpec.rail_optimized("j", 4, 1, k, GROUPS)
            res = Simulation(job, dp_pp_programs(0.05), iterations=5,
                             config=CoreConfig(degree_aware=da), switching_delay=20).run()
            assert res.violations == []
            counts[(k, da)] = (res.reconfig_rails, res.counters["avoided_reconfigurations"])
    assert counts[(2, True)][0] == 4  # each of the 4 pairs lit once, then kept
    assert counts[(2, True)][1] == 16  # every later phase change on rail 0 avoided
    assert counts[(2, False)][0] == 20
    assert counts[(1, True)] == (counts[(1, False)][0], 0)  # K=1: nothing to keep


def test_sim_driver_switching_model_and_dark_time() -> None:
    clock = VirtualClock()
    drv = SimOcsDriver({0: [1, 2, 3, 4]}, "piezo", clock=clock)
    (res,) = drv.apply_many([Reconfiguration.of(0, add=[(1, 2)])])
    assert res.dark_ms == pytest.approx(25.0) and clock.now() == pytest.approx(0.025)
    results = drv.begin([Reconfiguration.of(0, add=[(3, 4)], remove=[(1, 2)])])
    assert drv.port_states(0)[1].value == "dark"
    clock.advance_to(results[0].t_light_s)
    assert drv.port_states(0)[3].value == "lit" and drv.port_states(0)[1].value == "idle"
    assert drv.dark_s_by_port(0) == pytest.approx({1: 0.05, 2: 0.05, 3: 0.025, 4: 0.025})
    with pytest.raises(ReconfigurationRejected):
        drv.begin([Reconfiguration.of(0, add=[(3, 1)])])  # port 3 already has a peer
    a = SimOcsDriver({0: [1, 2]}, 10, clock=VirtualClock(), jitter_ms=2, seed=7)
    b = SimOcsDriver({0: [1, 2]}, 10, clock=VirtualClock(), jitter_ms=2, seed=7)
    da = [a.switching_delay_ms(0) for _ in range(5)]
    assert da == [b.switching_delay_ms(0) for _ in range(5)]
    assert all(8 <= d <= 12 for d in da) and len(set(da)) > 1


# ------------------------------------------------------------- property test

@st.composite
def random_runs(draw: st.DrawFn) -> tuple[JobSpec, dict[int, list[Op]], CoreConfig, float]:
    k = draw(st.sampled_from([1, 2]))
    n = draw(st.integers(3, 6))
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), min_size=2, max_size=5, unique=True))
    groups = [CommGroup(f"g{i}", "x", p) for i, p in enumerate(chosen)]
    if k == 2 and n >= 3:
        groups.append(CommGroup("ring", "dp", tuple(range(3))))
    job = JobSpec.rail_optimized("j", n, 1, k, groups)
    # a global order of calls that every member follows (as NCCL requires) avoids app deadlock
    order = draw(st.lists(st.sampled_from(groups), min_size=1, max_size=8))
    progs: dict[int, list[Op]] = {r: [] for r in range(n)}
    for g in order:
        dur = draw(st.sampled_from([0.0, 0.001, 0.01]))
        for r in g.ranks:
            gap = draw(st.sampled_from([0.0, 0.002, 0.02]))
            progs[r] += [Compute(gap), Call(g.group_id, "x", 1, dur)]
    cfg = CoreConfig(provisioning=draw(st.booleans()), degree_aware=draw(st.booleans()))
    delay = draw(st.sampled_from([0.0, 1.0, 15.0]))
    return job, progs, cfg, delay


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_runs(), st.integers(1, 3), st.floats(0, 3))
def test_no_active_circuit_is_ever_cut(run: tuple, iterations: int, jitter_ms: float) -> None:
    job, progs, cfg, delay = run
    res = Simulation(job, progs, iterations=iterations, config=cfg, switching_delay=delay,
                     jitter_ms=jitter_ms, seed=1).run(until_s=1000)
    assert res.violations == []


def test_bench_reports_the_figures() -> None:
    from controller.bench import bench_core, run_intents_bench

    res = run_intents_bench(n_calls=100, iterations=1, repeats=1)
    assert set(res["ack_ms"]) == {"p50", "p99"} and res["ack_ms"]["p50"] > 0
    assert res["core_intents_per_s"] > 0
    assert bench_core(iterations=1)["acks"] == 1024 * 4 * 2
