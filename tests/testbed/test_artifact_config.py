"""``artifact_protocol.port`` in experiment files and ``run --artifact-port`` (issue 38)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.errors import RunRefused
from testbed.experiment.config import ExperimentError, parse_experiment
from testbed.studies.run import run_one
from workloads.errors import WorkloadConfigError

TINY = (Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml").read_text()


def test_port_parsed_and_checked() -> None:
    assert parse_experiment(TINY).artifact_port is None
    cfg = parse_experiment(TINY + "artifact_protocol:\n  port: 1234\n")
    assert cfg.artifact_port == 1234 and cfg.to_json()["artifact_port"] == 1234
    with pytest.raises(WorkloadConfigError, match=r"artifact_protocol.port.*65535"):
        parse_experiment(TINY + "artifact_protocol:\n  port: 70000\n")
    with pytest.raises(WorkloadConfigError, match="unknown key 'listen'"):
        parse_experiment(TINY + "artifact_protocol:\n  listen: 0.0.0.0\n")
    with pytest.raises(ExperimentError, match="no failover"):
        parse_experiment(TINY + "artifact_protocol:\n  port: 0\n").replace(no_spares=True)


def test_sim_backend_refuses_it(tmp_path: Path) -> None:
    cfg = parse_experiment(TINY + "artifact_protocol:\n  port: 0\n")
    with pytest.raises(RunRefused, match="sim backend"):
        run_one(cfg, tmp_path / "r", "sim", lambda _m: None)
