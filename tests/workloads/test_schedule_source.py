"""``workload: {schedule: FILE}``: experiments that replay a schedule file instead of a model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from wl_helpers import tiny

from testbed.experiment.config import load_experiment
from testbed.experiment.prepare import prepare
from workloads import WorkloadConfigError, generate_schedule
from workloads.loader import load_workload_source

EXPERIMENT = """\
name: replay
cluster: {servers: 4, gpus_per_server: 1}
workload: {schedule: sched.json}
mode: on-demand
"""


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    tiny(4, 1, fsdp=2, pp=2).to_json(str(tmp_path / "sched.json"))
    return tmp_path


def test_an_experiment_replays_its_schedule_file(saved: Path) -> None:
    (saved / "exp.yaml").write_text(EXPERIMENT)
    cfg = load_experiment(saved / "exp.yaml")
    assert cfg.schedule_file == str((saved / "sched.json").resolve())
    assert cfg.schedule() == tiny(4, 1, fsdp=2, pp=2)
    assert cfg.to_json()["schedule_file"] == cfg.schedule_file
    prep = prepare(cfg, check_capacity=False)
    assert prep.schedule == tiny(4, 1, fsdp=2, pp=2) and prep.plan.programs
    assert load_workload_source(saved / "exp.yaml").schedule() == prep.schedule


@pytest.mark.parametrize(("text", "where", "why"), [
    (EXPERIMENT.replace("servers: 4, gpus_per_server: 1", "servers: 2, gpus_per_server: 2"),
     "exp.yaml:2:10: cluster", "is for 4 servers x 1 GPUs, not 2 x 2"),
    (EXPERIMENT.replace("{schedule: sched.json}", "{schedule: sched.json, gpu: h100}"),
     "exp.yaml:3:39: workload.gpu", "not allowed with 'schedule'"),
    (EXPERIMENT.replace("sched.json", "absent.json"),
     "exp.yaml:3:22: workload.schedule", "absent.json: cannot read it"),
    (EXPERIMENT.replace("sched.json", "exp.yaml"),
     "exp.yaml:3:22: workload.schedule", "not JSON"),
])
def test_bad_schedule_workloads_are_refused_with_their_position(
        saved: Path, text: str, where: str, why: str) -> None:
    (saved / "exp.yaml").write_text(text)
    with pytest.raises(WorkloadConfigError) as err:
        load_experiment(saved / "exp.yaml")
    assert where in str(err.value) and why in str(err.value)


def test_a_schedule_file_that_is_not_a_schedule_is_named(saved: Path) -> None:
    (saved / "sched.json").write_text('{"format": "something else"}')
    (saved / "exp.yaml").write_text(EXPERIMENT)
    with pytest.raises(WorkloadConfigError, match=r"sched\.json: format: not a version-1"):
        load_experiment(saved / "exp.yaml")


def test_a_config_without_a_model_cannot_generate() -> None:
    cfg = dataclasses.replace(tiny(4, 1, fsdp=2, pp=2).config, model=None)
    with pytest.raises(WorkloadConfigError, match=r"workload\.model: required: a captured"):
        generate_schedule(cfg)
