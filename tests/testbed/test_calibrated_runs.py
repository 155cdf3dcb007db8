"""A workload calibrated to a measured step: loading, refusal before anything starts, reports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.errors import RunRefused
from testbed.experiment.config import ExperimentConfig, load_experiment
from testbed.experiment.prepare import prepare
from testbed.results.summary import summary_text
from testbed.simulator.run import run_simulated
from testbed.studies.sweep import sweep_calibration

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "examples" / "llama3-8b-artifact.yaml"


@pytest.fixture(scope="module")
def artifact() -> ExperimentConfig:
    return load_experiment(ARTIFACT)


def test_the_artifact_example_is_calibrated_when_it_loads(artifact: ExperimentConfig) -> None:
    w = artifact.workload
    assert (w.calibrate_step_s, w.activation_checkpointing, w.parallel.reshard) == (
        10.18, "full", True)
    assert 1.0 < w.compute_scale < 2.0
    prep = prepare(artifact, check_capacity=False)
    assert prep.config.workload.compute_scale == w.compute_scale  # not calibrated again
    assert prep.modeled_iteration_s == pytest.approx(10.18, rel=1e-6)


def test_prepare_calibrates_a_config_built_in_code(artifact: ExperimentConfig) -> None:
    raw = dataclasses.replace(artifact, workload=dataclasses.replace(artifact.workload,
                                                                     compute_scale=1.0))
    prep = prepare(raw, check_capacity=False)
    assert prep.config.workload.compute_scale == pytest.approx(artifact.workload.compute_scale,
                                                               rel=1e-6)
    assert prep.modeled_iteration_s == pytest.approx(10.18, rel=1e-6)
    short = dataclasses.replace(raw, workload=dataclasses.replace(raw.workload,
                                                                  calibrate_step_s=0.01))
    with pytest.raises(RunRefused, match=r"calibrate_step_s: 0\.01 s cannot be reached"):
        prepare(short, check_capacity=False)


def test_a_sim_run_reports_the_scale_and_the_modelled_step(artifact: ExperimentConfig,
                                                           tmp_path: Path) -> None:
    cfg = artifact.replace(mode="baseline", warmup=0, iterations=1)
    s = run_simulated(prepare(cfg, check_capacity=False), tmp_path / "run", lambda _m: None)
    assert (s["calibrate_step_s"], s["compute_scale"]) == (10.18,
                                                           artifact.workload.compute_scale)
    assert s["modeled_iteration_s"] == pytest.approx(10.18, rel=1e-6)
    assert s["dark_error_ms"] is None  # the sim backend switches exactly
    text = summary_text(s)
    gap = 100 * (s["iteration_time_s"] / 10.18 - 1)
    assert (f"calibration         compute x{s['compute_scale']:.4f}: modelled electrical step "
            f"10.180 s (target 10.18 s); measured baseline {s['iteration_time_s']:.3f} s "
            f"({gap:+.1f} %") in text


def test_sweep_json_reports_the_calibration_and_the_baseline_gap(
        artifact: ExperimentConfig) -> None:
    points = [("", "baseline", 0.0), ("rail-state", "on-demand", 100.0)]
    summaries = [{"iteration_time_s": 10.69, "modeled_iteration_s": 10.18},
                 {"iteration_time_s": 12.0, "modeled_iteration_s": 10.18}]
    cal = sweep_calibration(artifact, points, summaries)
    assert cal is not None
    assert cal["gap_pct"] == pytest.approx(100 * (10.69 / 10.18 - 1)) and cal["far"]  # 5.0 %
    assert (cal["calibrate_step_s"], cal["modeled_iteration_s"]) == (10.18, 10.18)
    summaries[0]["iteration_time_s"] = 10.4  # 2.2 %: close enough
    assert not sweep_calibration(artifact, points, summaries)["far"]  # type: ignore[index]
    plain = load_experiment(ROOT / "examples" / "tiny.yaml")
    assert sweep_calibration(plain, points, summaries) is None


def test_run_refuses_an_unreachable_target_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("testbed.cli.main.signal.signal", lambda *_args: None)  # pytest's own
    text = ARTIFACT.read_text().replace("calibrate_step_s: 10.18 ", "calibrate_step_s: 0.05 ")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "calibrate_step_s" in row)
    out = tmp_path / "out"
    assert main(["run", str(bad), "--backend", "sim", "--out", str(out)]) == 2
    assert f"bad.yaml:{line}:21: workload.calibrate_step_s: 0.05 s cannot be reached: the " \
        "step's communication alone takes" in capsys.readouterr().err
    assert not out.exists()
    assert main(["sweep", str(bad), "--backend", "sim", "--out", str(out)]) == 2
    assert "cannot be reached" in capsys.readouterr().err and not out.exists()
