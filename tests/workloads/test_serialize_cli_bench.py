"""JSON round trip, the CLI hook and the benchmark."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
from wl_helpers import TINY_MOE, tiny

from workloads import Schedule, WorkloadConfigError, total_params
from workloads.bench import bench_config, run_workload_bench
from workloads.cli import add_arguments, run

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20


def test_json_round_trip_is_exact(paper_schedule: Schedule, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    paper_schedule.to_json(str(path))
    back = Schedule.from_json(str(path))
    assert back == paper_schedule
    assert back.ops_of(9) == paper_schedule.ops_of(9)


def test_json_round_trip_with_uneven_experts(tmp_path: Path) -> None:
    s = tiny(2, 2, model=TINY_MOE, fsdp=4, ep=4, microbatches=1)
    s.to_json(str(tmp_path / "m.json"))
    back = Schedule.from_json(str(tmp_path / "m.json"))
    assert back == s and back.programs[3].ops == s.programs[3].ops


def test_hand_edited_forward_dependency_is_rejected(tmp_path: Path) -> None:
    s = tiny(1, 2, dp=2, microbatches=1)
    path = tmp_path / "s.json"
    s.to_json(str(path))
    doc = json.loads(path.read_text())
    doc["programs"][0]["ops"]["deps"][0] = [5]
    path.write_text(json.dumps(doc))
    with pytest.raises(WorkloadConfigError, match="later or missing"):
        Schedule.from_json(str(path))


def test_thread_column_is_written_only_when_some_op_is_off_the_main_thread(
        tmp_path: Path) -> None:
    """Schedules of the main thread only keep their old form; an autograd op round-trips; an
    unknown thread is refused naming the column."""
    s = tiny(1, 2, dp=2, microbatches=1)
    path = tmp_path / "s.json"
    s.to_json(str(path))
    doc = json.loads(path.read_text())
    assert "thread" not in doc["programs"][0]["ops"]
    n = len(doc["programs"][0]["ops"]["kind"])
    doc["programs"][0]["ops"]["thread"] = ["main"] * (n - 1) + ["autograd"]
    path.write_text(json.dumps(doc))
    back = Schedule.from_json(str(path))
    assert back.programs[0].ops[-1].thread == "autograd"
    assert back.ops_of(0)[-1].thread == "autograd" and back.ops_of(0)[0].thread == "main"
    back.to_json(str(tmp_path / "again.json"))
    assert Schedule.from_json(str(tmp_path / "again.json")) == back
    doc["programs"][0]["ops"]["thread"][0] = "gpu"
    path.write_text(json.dumps(doc))
    with pytest.raises(WorkloadConfigError, match=r"unknown threads \['gpu'\]"):
        Schedule.from_json(str(path))


def _cli(*argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = io.StringIO()
    return run(parser.parse_args(list(argv)), out), out.getvalue()


def test_cli_json_phases_of_the_example(tmp_path: Path) -> None:
    code, text = _cli(str(ROOT / "examples" / "llama3-8b-workload.yaml"), "--json",
                      "--out", str(tmp_path / "s.json"))
    assert code == 0 and (tmp_path / "s.json").exists()
    rep = json.loads(text)
    assert rep["ranks"] == 16 and rep["ops"] > 0
    by = {(p["axis"], p["kind"]): p for p in rep["phases"]}
    assert int(by[("dp", "allgather")]["message_bytes"] / MIB) == 957
    assert int(by[("dp", "reducescatter")]["message_bytes"] / MIB) == 3829
    assert by[("pp", "sendrecv")]["max_call_bytes"] == 64 * MIB
    assert rep["windows"]["count"] >= 2


def test_cli_summary_and_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, text = _cli(str(ROOT / "examples" / "llama3-8b-workload.yaml"), "--rank", "8")
    assert code == 0 and "rank 8 (server 2, rail 0)" in text and "allgather" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: {servers: 1, gpus_per_server: 2}\nworkload: {model: x}\n")
    code, _ = _cli(str(bad))
    assert code == 2 and "bad.yaml:2:19: workload.model" in capsys.readouterr().err


def test_cli_models_the_rails_of_the_file(tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    """``workload FILE`` times the phases on the file's network.rail_gbps, as ``run`` does
    (it used 200 Gbit/s whatever the file said); --rail-gbps still overrides it."""
    tiny = str(ROOT / "examples" / "tiny.yaml")
    assert "rail_gbps: 400" in Path(tiny).read_text()
    rates = {}
    for extra in ((), ("--rail-gbps", "400"), ("--rail-gbps", "200")):
        code, text = _cli(tiny, "--json", *extra)
        rep = json.loads(text)
        rates[extra] = (rep["rail_gbps"], rep["modeled_iteration_s"])
    assert rates[()] == rates[("--rail-gbps", "400")]
    assert rates[()][0] == 400 and rates[("--rail-gbps", "200")][1] > rates[()][1]
    code, text = _cli(tiny)
    assert "on 400 Gbit/s rails" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(tiny).read_text().replace("rail_gbps: 400", "rail_gbps: fast"))
    code, _ = _cli(str(bad))
    assert code == 2 and "network.rail_gbps" in capsys.readouterr().err


def test_benchmark_reports_a_sane_iteration() -> None:
    """The benchmark's figures have their shape and are plausible; its speed and memory are
    what it reports (``opus-testbed bench workload --json``), not what a test asserts."""
    res = run_workload_bench()
    assert set(res) == {"gpus", "ops", "wall_s", "peak_rss_mb", "modeled_iteration_s",
                        "json_mb"}
    cfg = bench_config()
    gpus, par = cfg.cluster.world_size, cfg.parallel
    assert res["gpus"] == gpus == 16384
    # on every rank each layer's forward and backward, per micro-batch, is two computes, each
    # between a TP all-gather and reduce-scatter (SP): at least 6 ops (22.0 M in all)
    assert par.tp > 1 and par.sp
    assert res["ops"] >= gpus * cfg.num_microbatches * 2 * 6 * (cfg.model.n_layers // par.pp)
    # no faster than the ideal: 6 x params x tokens of the step at the GPUs' peak times MFU
    tokens = par.fsdp * par.dp * cfg.num_microbatches * cfg.micro_batch_size * cfg.seq_len
    ideal_s = 6 * total_params(cfg.model) * tokens / (
        gpus * cfg.gpu.peak_bf16_tflops * 1e12 * cfg.mfu)
    assert ideal_s < res["modeled_iteration_s"] < 10 * ideal_s, (ideal_s, res)
    assert res["json_mb"] > 0 and res["wall_s"] > 0 and res["peak_rss_mb"] > 0


def test_package_imports_nothing_from_the_other_packages() -> None:
    import subprocess
    import sys

    code = ("import sys, workloads, workloads.cli, workloads.bench, workloads.timing; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('emulator', 'controller', 'testbed', 'mininet', 'os_ken')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
