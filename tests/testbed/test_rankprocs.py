"""``run.ranks_per_process``: grouping ranks into server processes, the failover rule (pure)."""

from __future__ import annotations

import pytest

from emulator.topo import RailSpec
from testbed.experiment.config import ExperimentError, parse_experiment
from testbed.experiment.rankprocs import GroupingRefused, resolve, server_groups
from workloads.errors import WorkloadConfigError

BASE = """\
cluster: {servers: 2, gpus_per_server: 2}
workload:
  model: llama3-8b
  seq_len: 1024
  parallelism: {tp: 2, pp: 2}
run: {warmup: 1, iterations: 1, ranks_per_process: SETTING}
"""


def test_groups_are_the_ranks_of_each_server() -> None:
    spec = RailSpec(servers=3, gpus_per_server=4)
    assert server_groups(range(12), spec.server_of) == [
        (0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
    assert server_groups([5, 4, 0, 1], spec.server_of) == [(0, 1), (4, 5)]
    assert server_groups([], spec.server_of) == []


def test_resolve_without_failover() -> None:
    assert resolve("rank", None) == "rank"
    assert resolve("server", None) == "server"
    assert resolve("auto", None) == "server"


def test_auto_falls_back_to_a_process_per_rank_with_failover() -> None:
    assert resolve("auto", "the cluster has spare GPUs") == "rank"
    assert resolve("rank", "faults: kill") == "rank"


def test_server_with_failover_is_refused_naming_the_options() -> None:
    with pytest.raises(GroupingRefused) as info:
        resolve("server", "faults: kill")
    text = str(info.value)
    assert "faults: kill" in text and "rank" in text and "auto" in text


def test_unknown_setting_is_refused() -> None:
    with pytest.raises(GroupingRefused, match="rank, server, auto"):
        resolve("gpu", None)


def test_config_parses_and_records_the_setting() -> None:
    cfg = parse_experiment(BASE.replace("SETTING", "server"), "exp.yaml")
    assert cfg.ranks_per_process == "server" and cfg.rank_processes == "server"
    assert cfg.to_json()["ranks_per_process"] == "server"
    default = parse_experiment(BASE.replace(", ranks_per_process: SETTING", ""), "exp.yaml")
    assert default.ranks_per_process == "rank" and default.rank_processes == "rank"


def test_config_refuses_a_bad_value_at_its_position() -> None:
    with pytest.raises(WorkloadConfigError, match=r"exp\.yaml:6:\d+: run\.ranks_per_process"):
        parse_experiment(BASE.replace("SETTING", "gpu"), "exp.yaml")


def test_config_refuses_server_with_spares_and_auto_falls_back() -> None:
    spares = BASE.replace("gpus_per_server: 2}", "gpus_per_server: 2, spare_servers: 1}")
    with pytest.raises(WorkloadConfigError) as info:
        parse_experiment(spares.replace("SETTING", "server"), "exp.yaml")
    assert "run.ranks_per_process" in str(info.value) and "spare GPUs" in str(info.value)
    cfg = parse_experiment(spares.replace("SETTING", "auto"), "exp.yaml")
    assert cfg.rank_processes == "rank"


def test_no_spares_override_with_server_is_refused() -> None:
    cfg = parse_experiment(BASE.replace("SETTING", "server"), "exp.yaml")
    with pytest.raises(ExperimentError, match="no-spares"):
        cfg.replace(no_spares=True)
    assert cfg.replace(no_spares=True, ranks_per_process="auto").rank_processes == "rank"


def test_ocs_faults_keep_server_processes() -> None:
    text = BASE.replace("SETTING", "auto") + "faults:\n  - {kind: jitter, jitter_ms: 2, at_s: 1}\n"
    assert parse_experiment(text, "exp.yaml").rank_processes == "server"
