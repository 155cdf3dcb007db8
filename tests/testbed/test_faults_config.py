"""Spares, faults and failover settings in experiment files: layout, parsing, refusals (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.job import rank_rail_ports, spare_slots
from testbed.experiment.config import load_experiment, parse_experiment
from testbed.experiment.faults import FAULT_KINDS
from workloads.errors import WorkloadConfigError

ROOT = Path(__file__).resolve().parents[2]
BASE = """\
cluster: {servers: 4, gpus_per_server: 1, spare_servers: 1}
workload:
  model: llama3-8b
  seq_len: 1024
  parallelism: {fsdp: 2, pp: 2}
run: {warmup: 1, iterations: 3}
"""


# --- spare layout -----------------------------------------------------------------------------


def test_spare_ports_follow_every_rank_port_on_their_rail() -> None:
    spares = spare_slots(2, 4, 2, spares_per_server=2, spare_servers=1)
    assert [(s.server, s.rail) for s in spares] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (2, 3)]
    for rail in range(4):
        rank_ports = {p for r in range(8) for p in rank_rail_ports(r, 4, 2).ports
                      if rank_rail_ports(r, 4, 2).rail == rail}
        spare_ports = [p for s in spares if s.rail == rail for p in s.ports]
        assert min(spare_ports) > max(rank_ports)  # after the ranks', never among them
        assert len(spare_ports) == len(set(spare_ports))
        assert all(len(s.ports) == 2 for s in spares)


def test_no_spares_by_default() -> None:
    assert spare_slots(4, 2, 1) == []


# --- parsing ----------------------------------------------------------------------------------


def test_failover_example_loads_with_its_fault() -> None:
    cfg = load_experiment(ROOT / "examples" / "failover.yaml")
    assert [(f.kind, f.rank, f.at_iteration) for f in cfg.faults] == [("kill", 2, 3)]
    assert len(cfg.shape.spares) == 1 and cfg.failover.heartbeat_timeout_s == 2
    assert cfg.to_json()["faults"] == [{"kind": "kill", "rank": 2, "at_iteration": 3}]


def test_every_fault_kind_parses() -> None:
    text = BASE.replace("spare_servers: 1", "spare_servers: 3") + """\
faults:
  - {kind: kill, rank: 0, at_iteration: 1}
  - {kind: link_down, rank: 1, at_s: 0.5}
  - {kind: hang, rank: 2, at_iteration: 2}
  - {kind: port_failed, rail: 0, port: 4, at_iteration: 3}
  - {kind: jitter, jitter_ms: 3}
  - {kind: refuse, count: 2, at_iteration: 1}
"""
    with pytest.raises(WorkloadConfigError, match="not enough spares"):
        parse_experiment(text, "exp.yaml")  # four failures, three spares
    settings = "failover: {heartbeat_timeout_s: 1.5, migration_delay_s: 2, repair_s: 1}\n"
    cfg = parse_experiment(text.replace("spare_servers: 3", "spare_servers: 4") + settings,
                           "exp.yaml")
    assert [f.kind for f in cfg.faults] == list(FAULT_KINDS)
    assert cfg.faults[3].port == 4 and cfg.faults[5].count == 2
    assert cfg.failover.migration_delay_s == 2 and cfg.failover.repair_s == 1


@pytest.mark.parametrize(("faults", "field", "line", "message"), [
    ("  - {kind: kill, rank: 4, at_iteration: 1}\n", "faults[0].rank", 8,
     "rank 4 does not exist: the cluster has ranks 0..3"),
    ("  - {kind: kill, rank: 1, at_iteration: 4}\n", "faults[0].at_iteration", 8,
     "iteration 4 does not exist"),
    ("  - {kind: port_failed, rail: 0, port: 9, at_s: 1}\n", "faults[0].port", 8,
     "rail 0 has no port 9"),
    ("  - {kind: port_failed, rail: 1, port: 1, at_s: 1}\n", "faults[0].rail", 8,
     "rail 1 does not exist"),
    ("  - {kind: melt, rank: 1}\n", "faults[0].kind", 8, "must be one of kill"),
    ("  - {kind: kill, rank: 1}\n", "faults[0]", 8, "needs at_iteration or at_s"),
    ("  - {kind: kill, rank: 1, at_s: 1, at_iteration: 1}\n", "faults[0].at_s", 8,
     "not both"),
    ("  - {kind: jitter, jitter_ms: 0}\n", "faults[0].jitter_ms", 8, "must be > 0"),
    ("  - {kind: kill, rank: 1, port: 2, at_s: 1}\n", "faults[0].port", 8, "takes no 'port'"),
    ("  - {kind: kill, rank: one, at_s: 1}\n", "faults[0].rank", 8, "must be an integer"),
    ("  - {kind: kill, rank: 1, at_s: 1}\n  - {kind: kill, rank: 2, at_s: 2}\n", "faults[1]",
     9, "failure number 2 on rail 0 (rank 2), which has 1 spare(s)"),
    ("  - {kind: port_failed, rail: 0, port: 5, at_s: 1}\n  - {kind: kill, rank: 2, at_s: 2}\n",
     "faults[1]", 9, "not enough spares"),  # the spare's own port failed: it is lost
])
def test_bad_faults_name_the_key_and_position(faults: str, field: str, line: int,
                                              message: str) -> None:
    with pytest.raises(WorkloadConfigError) as info:
        parse_experiment(BASE + "faults:\n" + faults, "exp.yaml")
    assert info.value.field == field
    assert info.value.position.startswith(f"exp.yaml:{line}:")
    assert message in info.value.reason


def test_failures_without_spares_need_no_spares_or_repair() -> None:
    text = BASE.replace(", spare_servers: 1", "") + "faults:\n  - {kind: kill, rank: 1, at_s: 1}\n"
    with pytest.raises(WorkloadConfigError, match="run with --no-spares"):
        parse_experiment(text, "exp.yaml")
    cfg = parse_experiment(text + "failover: {repair_s: 1}\n", "exp.yaml")
    assert cfg.failover.repair_s == 1
    with_spare = parse_experiment(BASE + "faults:\n  - {kind: kill, rank: 1, at_s: 1}\n")
    assert with_spare.replace(no_spares=True).shape.spares == []


def test_overrides_are_checked_against_the_faults() -> None:
    cfg = parse_experiment(BASE + "faults:\n  - {kind: kill, rank: 1, at_iteration: 3}\n",
                           "exp.yaml")
    with pytest.raises(WorkloadConfigError) as info:
        cfg.replace(iterations=2)  # iteration 3 no longer exists
    assert info.value.field == "faults[0].at_iteration"
    assert info.value.position == "exp.yaml:8:5"
    spare_port = parse_experiment(BASE + "faults:\n  - {kind: port_failed, rail: 0, port: 5, "
                                  "at_s: 1}\n", "exp.yaml")
    with pytest.raises(WorkloadConfigError, match="rail 0 has no port 5"):
        spare_port.replace(no_spares=True)  # the spare and its port are gone


@pytest.mark.parametrize(("extra", "field"), [
    ("failover: {heartbeat_timeout_s: 0}\n", "failover.heartbeat_timeout_s"),
    ("failover: {repair_s: -1}\n", "failover.repair_s"),
    ("failover: {retries: 2}\n", "failover.retries"),
    ("faults: {kind: kill}\n", "faults"),
])
def test_bad_failover_settings_are_refused(extra: str, field: str) -> None:
    with pytest.raises(WorkloadConfigError) as info:
        parse_experiment(BASE + extra, "exp.yaml")
    assert info.value.field == field and info.value.position.startswith("exp.yaml:7:")


def test_negative_spares_are_refused() -> None:
    with pytest.raises(WorkloadConfigError) as info:
        parse_experiment(BASE.replace("spare_servers: 1", "spares_per_server: -1"), "exp.yaml")
    assert info.value.field == "cluster.spares_per_server"
    assert info.value.position.startswith("exp.yaml:1:")
