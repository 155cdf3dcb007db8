"""Torch experiment files: the script, its arguments, and errors at file:line:column."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.experiment.config import ExperimentError
from testbed.torchjob.config import (
    is_torch_experiment,
    load_torch_experiment,
    parse_torch_experiment,
)
from workloads.errors import WorkloadConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "torch"

GOOD = """\
name: t
cluster: {servers: 2, gpus_per_server: 1}
workload:
  torch:
    script: job.py
    args: [--steps, "{steps}", --seed, "{seed}", --lr, 0.5]
mode: provisioning
run: {warmup: 2, iterations: 3, seed: 7}
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "job.py").write_text("print('hi')\n")
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_a_torch_experiment_names_its_script_and_fills_placeholders(tmp_path: Path) -> None:
    exp = load_torch_experiment(_write(tmp_path, GOOD))
    assert exp.torch.script == (tmp_path / "job.py").resolve()
    assert exp.torch.argv(steps=exp.total_iterations, seed=exp.seed) == [
        "--steps", "5", "--seed", "7", "--lr", "0.5"]
    assert (exp.mode, exp.world_size, exp.name) == ("provisioning", 2, "t")
    assert exp.replace(mode="on-demand").mode == "on-demand"


@pytest.mark.parametrize(("old", "new", "where", "says"), [
    ("script: job.py", "script: nope.py", "exp.yaml:5:13", "no such file"),
    ('"{seed}"', '"{sed}"', "exp.yaml:6:40", "unknown placeholder {sed}; use {steps} or {seed}"),
    ("    args:", "    argz:", "exp.yaml:6:5", "unknown key 'argz'"),
    ("mode: provisioning", "mode: fast", "exp.yaml:7:7", "must be one of baseline"),
    ("servers: 2", "servers: 0", "exp.yaml:2:20", "must be an integer >= 1"),
    ("--lr, 0.5]", "--lr, [0.5]]", "exp.yaml:6:56", "must be a string or a number"),
    ("mode: provisioning", "mode: provisioning\nocs: {semantics: rail-state}", "exp.yaml:8:18",
     "a torch job runs port-exact"),
    ("mode: provisioning", "mode: provisioning\nfaults: [{kind: kill, rank: 0, at_iteration: 1}]",
     "exp.yaml:8:9", "a torch job cannot fail over"),
    ("gpus_per_server: 1}", "gpus_per_server: 1, spares_per_server: 1}", "exp.yaml:2:62",
     "a torch job cannot fail over"),
])
def test_bad_files_are_refused_at_the_key(tmp_path: Path, old: str, new: str, where: str,
                                         says: str) -> None:
    path = _write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(WorkloadConfigError) as info:
        load_torch_experiment(path)
    assert where in str(info.value) and says in str(info.value)


def test_which_files_are_torch_experiments(tmp_path: Path) -> None:
    assert is_torch_experiment(_write(tmp_path, GOOD))
    assert not is_torch_experiment(EXAMPLES.parent / "tiny.yaml")
    assert not is_torch_experiment(tmp_path / "missing.yaml")
    with pytest.raises(ExperimentError, match="cannot read"):
        load_torch_experiment(tmp_path / "missing.yaml")


def test_the_shipped_experiment_loads() -> None:
    exp = load_torch_experiment(EXAMPLES / "llama-tiny-4x1.yaml")
    assert exp.torch.script == EXAMPLES / "train_llama_tiny.py"
    assert exp.world_size == 4 and exp.mode == "on-demand"
    assert "{steps}" in exp.torch.args and exp.total_iterations == 3


def test_a_model_workload_is_not_a_torch_one() -> None:
    text = GOOD.replace("  torch:", "  model: llama3-8b\n  torchx:")
    with pytest.raises(WorkloadConfigError,
                       match=r"<string>:4:3: workload\.model: unknown key 'model'; allowed: torch"):
        parse_torch_experiment(text)


def test_the_sim_backend_refuses_a_torch_experiment(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.cli.main import main

    out = tmp_path / "run"
    assert main(["run", str(EXAMPLES / "llama-tiny-4x1.yaml"), "--backend", "sim",
                 "--out", str(out)]) == 2
    assert "runs on the emulated rails only" in capsys.readouterr().err
    assert not out.exists()
