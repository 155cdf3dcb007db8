"""The sim backend's cost models: ``fabric`` (the default) and ``emulator`` (cross-validation)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.experiment.config import SIM_COSTS, load_experiment, parse_experiment
from testbed.experiment.prepare import prepare
from testbed.simulator.network import (
    COST_MODELS,
    EMULATOR_COSTS,
    FABRIC_COSTS,
    FABRIC_DECISION_S,
    IDEAL_COSTS,
    costs_of,
)
from testbed.simulator.run import prepare_sim, run_simulated, sim_network
from workloads.errors import WorkloadConfigError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.yaml"


def test_the_config_and_the_simulator_name_the_same_cost_models() -> None:
    assert tuple(COST_MODELS) == SIM_COSTS
    assert costs_of("fabric") is FABRIC_COSTS and costs_of("emulator") is EMULATOR_COSTS
    with pytest.raises(ValueError, match="unknown cost model 'ideal'"):
        costs_of("ideal")


def test_fabric_is_the_fabric_alone_plus_the_controller_decision() -> None:
    assert FABRIC_COSTS == {**IDEAL_COSTS, "switch_overhead_s": FABRIC_DECISION_S}
    assert 0 < FABRIC_DECISION_S < 1e-4


def test_fabric_is_the_default_and_plans_the_real_bytes_at_the_rail_rate() -> None:
    cfg = load_experiment(TINY)
    assert cfg.sim_costs == "fabric"
    prep = prepare_sim(cfg)
    assert (prep.costs, prep.scale, prep.link_mbps) == ("fabric", 1.0, cfg.rail_gbps * 1e3)
    net = sim_network(prep)
    assert net.link_bps == cfg.rail_gbps * 1e9 and net.goodput == 1.0
    assert net.control_s == net.connect_s == net.step_s == net.finish_s == 0.0
    assert net.latency_s == pytest.approx(cfg.latency_us * 1e-6)
    assert net.switch_overhead_s == FABRIC_DECISION_S
    emu = prepare_sim(cfg, "emulator")
    assert emu.costs == "emulator" and emu.scale < 1
    assert sim_network(emu).goodput == EMULATOR_COSTS["goodput"]
    # prepare() alone is an emulated run's plan: the emulator's scaled link
    assert prepare(cfg, check_capacity=False).costs == "emulator"


def test_sim_costs_in_the_file_is_validated_with_its_position() -> None:
    text = TINY.read_text()
    assert parse_experiment(text + "sim:\n  costs: emulator\n").sim_costs == "emulator"
    lines = len(text.splitlines())
    with pytest.raises(WorkloadConfigError, match=rf"x\.yaml:{lines + 2}:\d+: sim\.costs: .*"
                       "'ideal'"):
        parse_experiment(text + "sim:\n  costs: ideal\n", "x.yaml")
    with pytest.raises(WorkloadConfigError, match="colour"):
        parse_experiment(text + "sim:\n  colour: blue\n", "x.yaml")


def test_fabric_baseline_is_the_modelled_step_and_emulator_costs_more(tmp_path: Path) -> None:
    cfg = load_experiment(TINY).replace(mode="baseline", iterations=1)
    fab = run_simulated(prepare_sim(cfg), tmp_path / "f", lambda _m: None)
    emu = run_simulated(prepare_sim(cfg, "emulator"), tmp_path / "e", lambda _m: None)
    assert fab["costs"] == "fabric" and emu["costs"] == "emulator"
    assert fab["iteration_time_s"] == pytest.approx(fab["modeled_iteration_s"], rel=0.02)
    assert emu["iteration_time_s"] > 1.5 * fab["iteration_time_s"]
    saved = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert saved["costs"] == "fabric"
    assert json.loads((tmp_path / "f" / "manifest.json").read_text())["costs"] == "fabric"


def test_fabric_switch_costs_its_delay_and_one_decision_at_two_ports(tmp_path: Path) -> None:
    """At K=2 the FSDP and PP circuits of tiny.yaml coexist: the overhead is the switches'."""
    cfg = load_experiment(TINY).replace(iterations=1, ports_per_rank=2)
    base = run_simulated(prepare_sim(cfg.replace(mode="baseline")), tmp_path / "b",
                         lambda _m: None)
    run = run_simulated(prepare_sim(cfg.replace(switching_delay=0.01)), tmp_path / "r",
                        lambda _m: None)
    per_switch_s = 0.01e-3 + FABRIC_DECISION_S
    extra_s = run["iteration_time_s"] - base["iteration_time_s"]
    assert 0 <= extra_s <= run["reconfigurations_per_iteration"] * per_switch_s + 1e-9
    assert extra_s / base["iteration_time_s"] < 0.01


def test_run_header_and_summary_name_the_cost_model(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "testbed.cli.main", "run", str(TINY), "--backend", "sim",
         "--mode", "baseline", "--iterations", "1", "--out", str(tmp_path / "f")],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert "rails 400 Gbit/s per port, real bytes, costs fabric" in res.stderr
    assert "Mbit/s" not in res.stderr
    assert "sim, costs fabric) ==" in res.stdout
    assert "the modelled 400 Gbit/s rail" in res.stdout
    res = subprocess.run(
        [sys.executable, "-m", "testbed.cli.main", "run", str(TINY), "--backend", "sim",
         "--mode", "baseline", "--iterations", "1", "--costs", "emulator", "--out",
         str(tmp_path / "e")], capture_output=True, text=True, cwd=ROOT, timeout=120,
        check=False)
    assert res.returncode == 0, res.stderr
    assert "costs emulator" in res.stderr and "the emulator's" in res.stderr
    assert "sim, costs emulator) ==" in res.stdout


def test_costs_refuses_an_unknown_model() -> None:
    res = subprocess.run([sys.executable, "-m", "testbed.cli.main", "run", str(TINY),
                          "--backend", "sim", "--costs", "ideal"], capture_output=True,
                         text=True, cwd=ROOT, timeout=60, check=False)
    assert res.returncode == 2 and "ideal" in res.stderr


def test_a_sweep_runs_every_point_under_the_files_cost_model(tmp_path: Path) -> None:
    from testbed.studies.sweep import run_sweep

    cfg = load_experiment(TINY).replace(iterations=1, sim_costs="emulator")
    rows = run_sweep(cfg, [0.0, 1.0], ["on-demand"], tmp_path / "s", "sim", 1, lambda _m: None)
    assert json.loads((tmp_path / "s" / "sweep.json").read_text())["costs"] == "emulator"
    for row in rows:
        saved = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        assert saved["costs"] == "emulator"
