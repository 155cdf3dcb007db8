"""``bench alltoall`` / ``bench stragglar`` on the IDEAL sim (small), and the refusals of
algorithm choices the ports cannot carry, through the command line (exit 2, position)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.experiment.config import parse_experiment
from testbed.experiment.prepare import prepare
from testbed.studies.collective_bench import IDEAL_RAIL, run_alltoall_bench, run_stragglar_bench
from workloads.algorithms import alltoall_model_s


def test_alltoall_bench_times_match_the_model_and_give_the_crossover(tmp_path: Path) -> None:
    out = run_alltoall_bench(ranks=(4, 8), size_mib=8.0, delays_ms=(0.01, 1.0, 10.0),
                             backends=("sim-ideal",), plot=tmp_path / "a2a.png",
                             say=lambda _m: None)
    json.dumps(out)
    assert {(p["ranks"], p["algorithm"]) for p in out["points"]} == {
        (n, a) for n in (4, 8) for a in ("electrical", "matchings", "multihop")}
    for p in out["points"]:
        assert p["delivered"]
        assert p["time_per_a2a_s"] == pytest.approx(p["model_s"], rel=1e-4, abs=2e-6), p
    eight = out["crossover_ms"]["8"]
    assert eight["sim-ideal"]["ms"] == pytest.approx(eight["model"]["ms"], rel=1e-3)
    assert eight["model_shared_nic"]["ms"] > eight["model"]["ms"]
    # four ranks: multihop's two steps beat three matching rounds even without switching
    assert out["crossover_ms"]["4"]["sim-ideal"]["ms"] is None
    assert out["crossover_ms"]["4"]["model"]["ms"] is None
    assert out["port_rate"].startswith("each of a rank's K ports runs at the full rail rate")
    assert out["points"][1]["switching_delay_label"].startswith("0.01 ms (RotorNet-class")
    assert (tmp_path / "a2a.png").stat().st_size > 0


def test_the_model_crossover_at_eight_ranks_is_the_design_notes() -> None:
    """128 MiB per rank, K = 2: 0.164 ms with full-rate ports, ~1.5 ms with one shared NIC."""
    size = 128 * 2**20
    m0 = alltoall_model_s("matchings", 8, size, 0.0, IDEAL_RAIL)
    full = alltoall_model_s("multihop", 8, size, 0.0, IDEAL_RAIL)
    shared = alltoall_model_s("multihop", 8, size, 0.0, IDEAL_RAIL, shared_nic=True)
    assert (full - m0) / 4 * 1e3 == pytest.approx(0.164, abs=1e-3)
    assert (shared - m0) / 4 * 1e3 == pytest.approx(1.506, abs=1e-3)


def test_stragglar_bench_speedups_match_the_model(tmp_path: Path) -> None:
    out = run_stragglar_bench(ranks=4, size_mib=256.0, straggler_delays_ms=(0.0, 50.0),
                              switching_delays_ms=(1.0,), backends=("sim-ideal",),
                              plot=tmp_path / "s.png", say=lambda _m: None)
    json.dumps(out)
    assert len(out["points"]) == 2 * 2 * 2  # fabrics x delays x algorithms
    for s in out["speedups"]:
        assert s["after_arrival"] == pytest.approx(s["model_after_arrival"], rel=5e-3)
    late = next(s for s in out["speedups"]
                if s["fabric"] == "electrical" and s["straggler_delay_ms"] == 50.0)
    # n = 4: ring 6 steps of S/4 against 4 rounds of S/3 once the reduce-scatter is hidden
    assert late["after_arrival"] == pytest.approx(1.125, rel=2e-3)
    assert out["target"]["target_met"] == {"sim-ideal": False}  # 1.125 < 1.15 at n = 4
    assert (tmp_path / "s.png").stat().st_size > 0


def test_bench_refuses_an_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "alltoall", "--backends", "sim-perfect", "--json"]) == 2
    assert "unknown backend(s) ['sim-perfect']" in capsys.readouterr().err


EXPERIMENT = """\
cluster: {servers: 8, gpus_per_server: 1}
workload: {model: mixtral-8x7b, parallelism: {fsdp: 8, ep: 8}, algorithms: {all_to_all: ALGO}}
mode: MODE
ocs: {ports_per_rank: 1}
"""


def test_multihop_on_one_port_is_refused_at_its_place_and_nothing_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT.replace("ALGO", "multihop").replace("MODE", "on-demand"))
    out = tmp_path / "out"
    assert main(["run", str(path), "--backend", "sim", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2:89: workload.algorithms.all_to_all: multihop needs 2 ports per rank" \
        in err and "ocs.ports_per_rank is 1" in err
    assert not out.exists()


def test_packet_switched_rails_take_any_algorithm_on_one_port() -> None:
    """The baseline's electrical rails and rail-state's data rails have no port budget."""
    for algo in ("multihop", "pairwise"):
        cfg = parse_experiment(EXPERIMENT.replace("ALGO", algo).replace("MODE", "baseline"))
        prep = prepare(cfg, check_capacity=False)
        assert prep.plan.electrical
    rings = parse_experiment(  # FSDP rings of four on rail-state's one port per rank
        "cluster: {servers: 4, gpus_per_server: 1}\nworkload: {model: llama3-8b, "
        "parallelism: {fsdp: 4}}\nmode: on-demand\nocs: {semantics: rail-state}\n")
    assert prepare(rings, check_capacity=False).plan.electrical
    cfg = parse_experiment(EXPERIMENT.replace("ALGO", "matchings").replace("MODE", "on-demand")
                           .replace("ports_per_rank: 1", "ports_per_rank: 2"))
    groups = prepare(cfg, check_capacity=False).plan.groups  # FSDP's rings need K = 2
    assert [g for g in groups if g.startswith("ep0.")] == [f"ep0.m{j}" for j in range(4)]


def test_an_algorithm_that_does_not_exist_is_refused_by_the_workload_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT.replace("all_to_all: ALGO", "all_gather: matchings")
                    .replace("MODE", "on-demand"))
    assert main(["workload", str(path)]) == 2
    assert f"{path}:2:89: workload.algorithms.all_gather: algorithm 'matchings' does not " \
        "exist for all_gather" in capsys.readouterr().err
