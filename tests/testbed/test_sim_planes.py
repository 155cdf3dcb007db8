"""The rival planes on the sim engine (:mod:`testbed.simulator.planes`): relays cost both links,
the rotor's transfers wait for their slot and span slots, and every check fires when broken."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest
from sim_programs import Programs

from controller.job import CommGroup, JobSpec, rail_job_ports
from controller.planes.rotor import round_robin
from testbed.experiment.config import RunSettings
from testbed.plan.replay import PlanOp
from testbed.simulator.engine import SimulationError
from testbed.simulator.invariants import InvariantViolation
from testbed.simulator.network import IDEAL_COSTS, network_model
from testbed.simulator.planecheck import PlaneInvariants
from testbed.simulator.planes import PlaneSimulation, server_demand

MBPS = 1000  # 1 Gbit/s per port
LATENCY_US = 5
NET = network_model(MBPS, LATENCY_US, IDEAL_COSTS)
RING = CommGroup("ring", "dp", (0, 1, 2, 3))  # four single-GPU servers on one rail
PAIR01 = CommGroup("p01", "pp", (0, 1), pairs=((0, 1),))
PAIR02 = CommGroup("p02", "pp", (0, 2), pairs=((0, 2),))


def plane_sim(programs: Mapping[int, list[PlanOp]], groups: list[CommGroup], plane: str, *,
              k: int = 1, delay_ms: float = 0.0, slot_ms: float | None = None,
              iterations: int = 1, relay_paths: str = "fixed") -> PlaneSimulation:
    ports = rail_job_ports(programs, 1, k)
    job = JobSpec("j", ports, {g.group_id: g for g in groups}, check_ports=False)
    settings = RunSettings(mode="on-demand", control_plane=plane, switching_delay=delay_ms,
                           rotor_slot_ms=slot_ms, ports_per_rank=k, iterations=iterations,
                           warmup=0, relay_paths=relay_paths)
    return PlaneSimulation(programs, job, settings, network=NET, gpus_per_server=1)


def pair01(chunk: int) -> Programs:
    """0 <-> 1 exchange ``chunk``; servers 2 and 3 only compute (the rotor still has 4)."""
    return Programs(range(4)).call(PAIR01, chunk).compute(2, 1e-6).compute(3, 1e-6)


def call_ends(records: list[dict]) -> dict[tuple[int, str], float]:
    return {(r["rank"], r["tag"]): r["t_end"] for r in records if r["ev"] == "call"}


def test_static_ring_with_two_ports_runs_at_line_rate() -> None:
    chunk = 125_000  # 1 ms at 1 Gbit/s
    progs = Programs(range(4)).call(RING, chunk)
    sim = plane_sim(progs.ops, [RING], "static", k=2)
    records, _ = sim.run()
    # three ring steps of 1 ms plus the hop latency each, no relay
    assert max(call_ends(records).values()) == pytest.approx(3 * (1e-3 + 5e-6), rel=1e-6)
    stats = sim.plane_summary()
    assert stats["relayed_share"] == 0.0
    assert stats["bytes_delivered"] == stats["bytes_scheduled"] == 4 * 3 * chunk


def test_static_relay_costs_both_links() -> None:
    # two ports each: the ring takes both matchings, so 0 <-> 2 has no circuit and is relayed
    # through 1 or 3; alone, a relayed transfer runs at line rate with one more hop's latency
    chunk = 125_000  # lighter than the ring's pairs, so the ring gets the circuits
    progs = Programs(range(4)).call(RING, 1_000_000).call(PAIR02, chunk)
    sim = plane_sim(progs.ops, [RING, PAIR02], "static", k=2)
    records, _ = sim.run()
    ends = call_ends(records)
    start = max(ends[(0, "ring:0")], ends[(2, "ring:0")])  # both ends of 0 <-> 2 are ready
    assert ends[(0, "p02:0")] - start == pytest.approx(1e-3 + 2 * 5e-6, rel=1e-6)
    relayed = 2 * chunk / (2 * chunk + 12 * 1_000_000)
    assert sim.plane_summary()["relayed_share"] == pytest.approx(relayed)
    assert server_demand(progs.ops, 1)[(0, 2)] == 2 * chunk


def _crossed_relays() -> tuple[Programs, list[CommGroup]]:
    """The ring 0-1-2-3 takes both ports (K = 2); after it, 0 <-> 2 and 1 <-> 3 exchange 1 ms
    each at once, every transfer relayed (via 1 or 3, via 0 or 2)."""
    p13 = CommGroup("p13", "ep", (1, 3), pairs=((1, 3),))
    progs = Programs(range(4)).call(RING, 1_000_000).call(PAIR02, 125_000).call(p13, 125_000)
    return progs, [RING, PAIR02, p13]


def test_static_fixed_paths_are_the_tables_and_may_share_a_circuit() -> None:
    progs, groups = _crossed_relays()
    sim = plane_sim(progs.ops, groups, "static", k=2)
    assert sim.static is not None
    paths = {key: path for key, path in sim.static.paths.items() if key[0] != "ring:0"}
    # balanced over the step's bytes, not over time: 0 -> 2 and 3 -> 1 both cross 3 -> 2
    assert set(paths[("p02:0", 0, 2)]) & set(paths[("p13:0", 3, 1)])
    records, _ = sim.run()
    ends = call_ends(records)
    ring_end = max(ends[(r, "ring:0")] for r in range(4))
    # two transfers on one circuit: each at half the rate, 2 ms, plus two hops' latency
    assert ends[(0, "p02:0")] - ring_end == pytest.approx(2e-3 + 2 * 5e-6, rel=1e-3)
    summary = sim.plane_summary()
    assert summary["relay_paths"] == "fixed"
    relayed = 4 * 125_000 / (4 * 125_000 + 12 * 10**6)  # the crossed transfers' share
    assert summary["bits_by_flows_on_port"]["2"] == pytest.approx(relayed)
    assert summary["bytes_delivered"] == summary["bytes_scheduled"]


def test_static_dynamic_paths_take_the_idle_circuits() -> None:
    progs, groups = _crossed_relays()
    sim = plane_sim(progs.ops, groups, "static", k=2, relay_paths="dynamic")
    records, _ = sim.run()
    ends = call_ends(records)
    ring_end = max(ends[(r, "ring:0")] for r in range(4))
    # the least-loaded hop now: the four relayed transfers share no port, 1 ms each
    for rank, tag in ((0, "p02:0"), (2, "p02:0"), (1, "p13:0"), (3, "p13:0")):
        assert ends[(rank, tag)] - ring_end == pytest.approx(1e-3 + 2 * 5e-6, rel=1e-3)
    summary = sim.plane_summary()
    assert summary["relay_paths"] == "dynamic"
    assert summary["bits_by_flows_on_port"] == {"1": pytest.approx(1.0)}
    assert summary["relayed_share"] == pytest.approx(4 * 125_000 / (4 * 125_000 + 12 * 10**6))
    assert summary["bytes_delivered"] == summary["bytes_scheduled"]


def test_relay_paths_in_the_experiment_file(tmp_path: Path) -> None:
    from testbed.experiment.config import load_experiment
    from workloads.errors import WorkloadConfigError

    text = Path("examples/tiny.yaml").read_text()
    path = tmp_path / "t.yaml"
    assert load_experiment(Path("examples/tiny.yaml")).relay_paths == "fixed"
    path.write_text(text + "controller:\n  plane: static\n  relay_paths: dynamic\n")
    assert load_experiment(path).relay_paths == "dynamic"
    path.write_text(text + "controller:\n  relay_paths: adaptive\n")
    with pytest.raises(WorkloadConfigError, match=r"controller\.relay_paths.*fixed, dynamic"):
        load_experiment(path)


def test_static_refuses_a_topology_that_leaves_pairs_apart() -> None:
    progs = Programs(range(4)).call(RING, 1000)
    with pytest.raises(SimulationError, match="without a path"):
        plane_sim(progs.ops, [RING], "static", k=1)


def test_rotor_transfer_waits_for_its_slot_and_spans_slots() -> None:
    # one switch: slot i holds matching i mod 3; 0 and 1 meet in matching 2 (slots 2, 5, ...)
    meets = [i for i, m in enumerate(round_robin(4)) if m[0] == 1]
    assert meets == [2]
    slot_s, delay_s = 1e-3, 0.1e-3
    lit_s = slot_s - delay_s
    chunk = int(1.5 * lit_s * MBPS * 1e6 / 8)  # one and a half lit slots of bytes
    progs = pair01(chunk)
    sim = plane_sim(progs.ops, [PAIR01], "rotor", delay_ms=delay_s * 1e3, slot_ms=slot_s * 1e3)
    records, _ = sim.run()
    end = call_ends(records)[(0, "p01:0")]
    # waits for slot 2's light, sends for its lit part, pauses, ends half way through slot 5's
    assert end == pytest.approx(5 * slot_s + delay_s + 0.5 * lit_s + 5e-6, rel=1e-6)
    stats = sim.plane_summary()
    assert stats["relayed_share"] == 0.0  # a single switch offers no same-slot relay
    assert stats["bytes_delivered"] == stats["bytes_scheduled"]
    assert stats["wait_s"] > 0


def test_rotor_relays_through_another_switch_in_the_same_slot() -> None:
    # two switches (K = 2): slot 0 holds matchings 0 and 1; 0 -> 1 meets in neither, so it
    # takes one relay hop: 0 -> 3 on matching 0, 3 -> 1 on matching 1
    progs = pair01(10_000)
    sim = plane_sim(progs.ops, [PAIR01], "rotor", k=2, delay_ms=0.01, slot_ms=1.0)
    sim.run()
    assert sim.plane_summary()["relayed_share"] == pytest.approx(1.0)


def test_rotor_cycle_check_fires_on_a_wrong_matching() -> None:
    progs = pair01(200_000)
    sim = plane_sim(progs.ops, [PAIR01], "rotor", delay_ms=0.01, slot_ms=0.5)
    rotor = sim.rotor
    assert rotor is not None
    real = rotor.config
    object.__setattr__(rotor, "config", lambda slot: real(slot + 1 if slot >= 1 else slot))
    with pytest.raises(SimulationError, match="other than its cycle's #1 in slot 1"):
        sim.run()


def test_plane_checks_fire() -> None:
    progs = Programs(range(4)).call(PAIR01, 1000)
    job = JobSpec("j", rail_job_ports(progs.ops, 1, 1), {"p01": PAIR01}, check_ports=False)
    checks = PlaneInvariants(job, 1)
    with pytest.raises(InvariantViolation, match="one-to-one"):
        checks.configuration({(0, 0): {0: 1, 1: 2, 2: 1}}, "a forged configuration")
    with pytest.raises(InvariantViolation, match="carried"):
        checks.transfer_done(0, 1, 1000, 7000.0, 1e9, 0.5)
    with pytest.raises(InvariantViolation, match="joins"):
        checks.hops({(0, 0): {0: 1, 1: 0}}, [((0, 0), 0, 2)], True, 0.5, 0, 2)
    with pytest.raises(InvariantViolation, match="dark"):
        checks.hops({(0, 0): {0: 1, 1: 0}}, [((0, 0), 0, 1)], False, 0.5, 0, 1)
    checks.scheduled_bytes = 10
    with pytest.raises(InvariantViolation, match="10 bytes scheduled but 0 delivered"):
        checks.finish()


def test_sweep_points_add_a_family_per_rival_plane() -> None:
    from testbed.studies.sweep import SweepError, sweep_points

    points = sweep_points(["baseline", "provisioning"], [0, 1, 10], planes=["opus", "rotor"])
    assert points == [("", "baseline", 0.0), ("port-exact", "provisioning", 1.0),
                      ("port-exact", "provisioning", 10.0), ("", "rotor", 1.0),
                      ("", "rotor", 10.0)]
    assert sweep_points(["provisioning"], [0, 5], planes=["static"]) == [
        ("", "baseline", 0.0), ("", "static", 5.0)]
    with pytest.raises(SweepError, match="unknown planes"):
        sweep_points(["provisioning"], [1], planes=["sirius"])


def test_controller_plane_in_the_experiment_file(tmp_path: Path) -> None:
    from testbed.experiment.config import load_experiment
    from workloads.errors import WorkloadConfigError

    text = Path("examples/tiny.yaml").read_text()
    path = tmp_path / "t.yaml"
    path.write_text(text + "controller:\n  plane: rotor\n  rotor_slot_ms: 200\n")
    cfg = load_experiment(path)
    assert (cfg.control_plane, cfg.rotor_slot_ms, cfg.packet_switched) == ("rotor", 200.0, True)
    assert cfg.rival_plane and not cfg.replace(mode="baseline").rival_plane
    path.write_text(text + "controller:\n  plane: sirius\n")
    with pytest.raises(WorkloadConfigError, match=r"controller\.plane.*opus, static, rotor"):
        load_experiment(path)


def test_sweep_with_planes_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from testbed.cli.main import main

    out = tmp_path / "sweep"
    assert main(["sweep", "examples/tiny.yaml", "--backend", "sim", "--planes",
                 "opus,static,rotor", "--delays", "0,1", "--modes", "baseline,provisioning",
                 "--ports-per-rank", "2", "--workers", "1", "--out", str(out)]) == 0
    meta = json.loads((out / "sweep.json").read_text())
    assert [(r["mode"], r["error"]) for r in meta["points"]] == [
        ("baseline", ""), ("provisioning", ""), ("static", ""), ("rotor", "")]
    assert [f["mode"] for f in meta["families"]] == ["provisioning", "static", "rotor"]
    rotor = json.loads((out / "rotor-1ms" / "summary.json").read_text())
    assert rotor["plane"] == "rotor"
    assert rotor["plane_stats"]["bytes_delivered"] == rotor["plane_stats"]["bytes_scheduled"]
    assert (out / "iteration_vs_delay.png").exists()
    capsys.readouterr()


def test_the_emulated_backend_refuses_the_rotor_and_a_static_plane_it_cannot_route(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.cli.main import main

    assert main(["run", "examples/tiny.yaml", "--plane", "rotor", "--out",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "controller.plane rotor runs on the sim backend only" in err
    assert "the emulated rotor" in err and "is not built" in err
    assert not (tmp_path / "run").exists()


def test_the_emulated_static_plane_refuses_two_ports_per_rank() -> None:
    from emulator.topo import RailSpec
    from testbed.emulated.staticrun import static_emulated
    from testbed.errors import RunRefused

    cfg = RunSettings(mode="on-demand", control_plane="static", ports_per_rank=2)
    spec = RailSpec(servers=4, gpus_per_server=1, ports_per_rank=2, link_mbps=None)
    with pytest.raises(RunRefused, match=r"one port per rank .* got 2"):
        static_emulated(cfg, None, spec)  # type: ignore[arg-type]
    with pytest.raises(RunRefused, match="the emulated rotor is not built"):
        static_emulated(dataclasses.replace(cfg, control_plane="rotor"), None,
                        spec)  # type: ignore[arg-type]
    one = RailSpec(servers=4, gpus_per_server=1, ports_per_rank=1, link_mbps=None)
    with pytest.raises(RunRefused, match="relay_paths dynamic runs on the sim backend only"):
        static_emulated(dataclasses.replace(cfg, ports_per_rank=1, relay_paths="dynamic"), None,
                        one)  # type: ignore[arg-type]


def test_an_emulated_sweep_runs_static_and_refuses_the_rotor_before_any_point(
        tmp_path: Path) -> None:
    from testbed.experiment.config import load_experiment
    from testbed.studies.sweep import SweepError, check_planes, run_sweep, sweep_points

    cfg = load_experiment(Path("examples/tiny.yaml"))  # one port per rank
    check_planes(cfg, sweep_points(["baseline", "provisioning"], [0, 1], planes=["opus",
                                                                             "static"]), "emu")
    with pytest.raises(SweepError, match=r"--planes rotor: .*controller\.plane rotor runs on "
                       r"the sim backend only \(issue 40: the emulated rotor"):
        check_planes(cfg, sweep_points(["baseline"], [1], planes=["static", "rotor"]), "emu")
    with pytest.raises(SweepError, match=r"--planes static: .*one port per rank .*got 2"):
        check_planes(cfg.replace(ports_per_rank=2),
                     sweep_points(["baseline"], [1], planes=["static"]), "emu")
    with pytest.raises(SweepError, match=r"--planes static: .*relay_paths dynamic runs on the "
                       "sim backend only"):
        check_planes(cfg.replace(relay_paths="dynamic"),
                     sweep_points(["baseline"], [1], planes=["static"]), "emu")
    # the sim runs them all
    check_planes(cfg.replace(ports_per_rank=2, relay_paths="dynamic"),
                 sweep_points(["baseline"], [1], planes=["static", "rotor"]), "sim")
    with pytest.raises(SweepError, match="--planes rotor"):
        run_sweep(cfg, [1.0], ["baseline"], tmp_path / "s", "emu", 1, planes=["rotor"])
    assert not (tmp_path / "s").exists()
