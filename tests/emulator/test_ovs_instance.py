"""emulator.ovs_instance's pure parts: paths, command lines, the mode's default; and what the
network hands the OCS app for per-rail instances."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from emulator import ovs_instance
from emulator.network import _instances_dir, _write_ocs_config
from emulator.ovs_instance import (
    OvsInstances,
    create_db_command,
    fits_unix_paths,
    instance_env,
    instance_paths,
    ofctl_target,
    ovsdb_server_command,
    per_rail_default,
    vsctl_command,
    vswitchd_command,
)
from emulator.runstate import RunRecord
from emulator.topo import RailSpec


def test_every_file_of_an_instance_is_in_its_directory() -> None:
    p = instance_paths("ot1a2r0", Path("/run/x/ovs"), Path("/run/x"))
    assert p.directory == Path("/run/x/ovs/ot1a2r0")
    assert p.db_target == "unix:/run/x/ovs/ot1a2r0/db.sock"
    assert p.mgmt_socket == Path("/run/x/ovs/ot1a2r0/ot1a2r0.mgmt")
    assert p.vswitchd_ctl == Path("/run/x/ovs/ot1a2r0/ovs-vswitchd.ctl")
    assert p.log_file == Path("/run/x/ovs-ot1a2r0.log")  # outlives the directory
    for path in (p.db_file, p.ovsdb_pidfile, p.ovsdb_ctl, p.vswitchd_pidfile, *p.sockets()):
        assert path.parent == p.directory


def test_both_daemons_carry_the_marker_and_stay_in_the_foreground() -> None:
    p = instance_paths("ot1a2s4", Path("/r/ovs"), Path("/r"))
    for cmd in (ovsdb_server_command(p), vswitchd_command(p)):
        assert p.marker in " ".join(cmd)
        assert "--detach" not in cmd and "--monitor" not in cmd  # held by pid
        assert f"--log-file={p.log_file}" in cmd
    assert ovsdb_server_command(p)[:3] == ["ovsdb-server", str(p.db_file),
                                           f"--remote=punix:{p.db_socket}"]
    sw = vswitchd_command(p)
    assert sw[:2] == ["ovs-vswitchd", p.db_target]
    assert f"--unixctl={p.vswitchd_ctl}" in sw
    assert {"--enable-dummy", "--disable-system"} <= set(sw)  # see the module docstring
    assert create_db_command(p) == ["ovsdb-tool", "create", str(p.db_file),
                                    str(ovs_instance.SCHEMA)]


def test_tools_target_the_instance() -> None:
    p = instance_paths("ot1a2r3", Path("/r/ovs"), Path("/r"))
    assert vsctl_command(p, "list-br", timeout_s=5) == [
        "ovs-vsctl", "--db=unix:/r/ovs/ot1a2r3/db.sock", "--timeout=5", "list-br"]
    assert ofctl_target(p) == "unix:/r/ovs/ot1a2r3/ot1a2r3.mgmt"
    env = instance_env(p, {"PATH": "/bin", "OVS_RUNDIR": "/var/run/openvswitch"})
    assert env == {"PATH": "/bin", "OVS_RUNDIR": str(p.directory),
                   "OVS_DBDIR": str(p.directory), "OVS_LOGDIR": "/r"}


def test_socket_paths_must_fit_a_unix_address() -> None:
    assert fits_unix_paths(instance_paths("ot1a2r0", Path("/tmp/out/ovs"), Path("/tmp")))
    deep = Path("/tmp") / ("d" * 90)
    assert not fits_unix_paths(instance_paths("ot1a2r0", deep, Path("/tmp")))


def test_the_instances_live_under_the_state_directory_not_the_run_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run directory may be a shared folder without Unix sockets (the Vagrant VM's
    results/) or too deep for a socket path: the instances' files go to the state directory."""
    monkeypatch.setenv("OPUS_STATE_DIR", str(tmp_path / "state"))
    assert _instances_dir("ot1a2") == tmp_path / "state" / "ovs" / "ot1a2"


@pytest.mark.parametrize(("value", "expected"), [
    ("1", True), ("true", True), (" On ", True), ("0", False), ("no", False),
    ("", ovs_instance.DEFAULT_PER_RAIL), ("maybe", ovs_instance.DEFAULT_PER_RAIL)])
def test_the_environment_picks_the_mode(value: str, expected: bool) -> None:
    assert per_rail_default({ovs_instance.PER_RAIL_ENV: value}, kernel_datapath=False) is expected
    assert per_rail_default({}, kernel_datapath=False) is ovs_instance.DEFAULT_PER_RAIL
    # where the kernel datapath is loaded (the Vagrant VM) the system daemon's is better
    assert per_rail_default({}, kernel_datapath=True) is False
    assert per_rail_default({ovs_instance.PER_RAIL_ENV: "1"}, kernel_datapath=True) is True


def test_the_ocs_app_gets_each_rails_own_sockets(tmp_path: Path) -> None:
    spec = RailSpec(servers=2, gpus_per_server=2, shadow_rails=2)
    bridges = ["ot1a2r0", "ot1a2r1", "ot1a2s2", "ot1a2s3"]
    instances = OvsInstances(bridges, tmp_path / "ovs", tmp_path, RunRecord("ot1a2", 1))
    config: dict[str, Any] = json.loads(
        _write_ocs_config(spec, "ot1a2", tmp_path, 6653, 8080, instances).read_text())
    assert [r["bridge"] for r in config["rails"]] == bridges
    for rail in config["rails"]:
        paths = instances.paths[rail["bridge"]]
        assert rail["mgmt_socket"] == str(paths.mgmt_socket)
        assert rail["unixctl_socket"] == str(paths.vswitchd_ctl)
    shared: dict[str, Any] = json.loads(
        _write_ocs_config(spec, "ot1a2", tmp_path, 6653, 8080).read_text())
    assert not any("mgmt_socket" in r for r in shared["rails"])


def test_a_rail_purges_its_own_vswitchd() -> None:
    from emulator.ocs_app import OcsFabric

    spec = RailSpec(servers=2, gpus_per_server=2)
    fabric = OcsFabric(spec.describe(), {0: 1, 1: 2}, bridges={0: "b0", 1: "b1"},
                       sockets={1: ("/r/b1/b1.mgmt", "/r/b1/ovs-vswitchd.ctl")})
    try:
        assert fabric._flusher(1)._path == "/r/b1/ovs-vswitchd.ctl"
        assert fabric._flusher(0)._path is None  # the system instance's
        assert fabric._flusher(0) is not fabric._flusher(1)
    finally:
        fabric.close()


EXPERIMENT = """name: t
cluster: {servers: 2, gpus_per_server: 1}
workload:
  model: llama3-8b
  parallelism: {tp: 1, fsdp: 2, pp: 1}
"""


def test_the_experiment_file_picks_the_mode() -> None:
    from testbed.experiment.config import parse_experiment
    from workloads.errors import WorkloadConfigError

    assert parse_experiment(EXPERIMENT, "x.yaml").ovs_per_rail is None  # the default's
    for text, expected in (("true", True), ("false", False), ("null", None)):
        cfg = parse_experiment(EXPERIMENT + f"network: {{ovs_per_rail: {text}}}\n", "x.yaml")
        assert cfg.ovs_per_rail is expected and cfg.to_json()["ovs_per_rail"] is expected
    with pytest.raises(WorkloadConfigError, match=r"network\.ovs_per_rail.*true or false"):
        parse_experiment(EXPERIMENT + "network: {ovs_per_rail: 1}\n", "x.yaml")
