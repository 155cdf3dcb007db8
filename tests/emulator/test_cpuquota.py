"""The ranks' CPU quota (:mod:`emulator.cpuquota`): the setting, detection of the cgroup version
from a mount table, the limits written, ``cpu.stat``, and the cgroup made on a fake cgroup root
in a temporary directory (no root needed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from emulator import cpuquota
from emulator.cpuquota import (
    AUTO,
    CgroupUnavailable,
    CpuController,
    RankCgroup,
    Throttling,
    find_cpu_controller,
    limit_files,
    parse_cpu_stat,
    placed_command,
    quota_summary,
    quota_text,
    resolve_fraction,
    validate_setting,
)


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("auto", AUTO), (0.7, 0.7), (1, 1.0), (0.05, 0.05)])
def test_accepted_settings(value: object, expected: object) -> None:
    assert validate_setting(value) == expected


@pytest.mark.parametrize(("value", "words"), [
    (0, "in (0, 1]"), (1.5, "in (0, 1]"), (-0.2, "in (0, 1]"), (True, "got True"),
    ("fast", "got 'fast'"), ([0.5], "got [0.5]")])
def test_refused_settings_say_what_is_accepted(value: object, words: str) -> None:
    with pytest.raises(ValueError, match="fraction of the machine") as info:
        validate_setting(value)
    assert words in str(info.value)


def test_auto_leaves_the_fabric_its_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_fraction(AUTO, 2) == pytest.approx(1 - cpuquota.AUTO_RESERVE_CORES / 2)
    monkeypatch.setattr(cpuquota, "AUTO_RESERVE_CORES", 0.9)
    assert resolve_fraction(AUTO, 1) == cpuquota.AUTO_MIN_FRACTION  # never below the floor
    assert resolve_fraction(AUTO, 64) == pytest.approx(1 - 0.9 / 64)
    assert resolve_fraction(0.5, 2) == 0.5
    assert resolve_fraction(None, 2) is None


def test_limits_per_version() -> None:
    assert limit_files(1, 0.7, 2) == {"cpu.cfs_period_us": "100000",
                                      "cpu.cfs_quota_us": "140000"}
    assert limit_files(2, 0.25, 4) == {"cpu.max": "100000 100000"}
    assert limit_files(2, 0.001, 1) == {"cpu.max": "1000 100000"}  # the kernel's floor


def _fake_root(tmp_path: Path, v2_controllers: str | None) -> tuple[str, Path, Path]:
    """A mount table naming a v2 hierarchy (its ``cgroup.controllers`` = ``v2_controllers``;
    None: no v2 mount) and a v1 cpu hierarchy, both in ``tmp_path``."""
    v2, v1 = tmp_path / "unified", tmp_path / "cpu"
    v2.mkdir(parents=True)
    v1.mkdir()
    lines = [f"cgroup {v1} cgroup rw,nosuid,nodev,noexec,relatime,cpu 0 0",
             f"cgroup {tmp_path / 'memory'} cgroup rw,relatime,memory 0 0",
             "proc /proc proc rw 0 0"]
    if v2_controllers is not None:
        (v2 / "cgroup.controllers").write_text(v2_controllers + "\n")
        lines.insert(0, f"cgroup2 {v2} cgroup2 rw,nosuid,nodev,noexec,relatime 0 0")
    return "\n".join(lines) + "\n", v1, v2


def test_detection_prefers_v2_with_cpu_else_v1(tmp_path: Path) -> None:
    mounts, v1, v2 = _fake_root(tmp_path / "a", "cpuset cpu io memory pids")
    assert find_cpu_controller(mounts) == CpuController(2, v2)
    hybrid, v1, _ = _fake_root(tmp_path / "b", "hugetlb")  # this machine: cpu bound to v1
    assert find_cpu_controller(hybrid) == CpuController(1, v1)
    v1_only, v1, _ = _fake_root(tmp_path / "c", None)
    assert find_cpu_controller(v1_only) == CpuController(1, v1)


def test_detection_says_why_there_is_none(tmp_path: Path) -> None:
    v2 = tmp_path / "cg"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("memory pids\n")
    why = find_cpu_controller(f"cgroup2 {v2} cgroup2 rw 0 0\n")
    assert isinstance(why, str) and str(v2) in why and "does not offer the cpu" in why
    assert find_cpu_controller("proc /proc proc rw 0 0\n") == (
        "no cgroup hierarchy with the cpu controller is mounted")
    # "cpuacct" or "cpuset" alone is not "cpu"
    assert isinstance(find_cpu_controller(f"cgroup {v2} cgroup rw,cpuacct 0 0\n"), str)


def test_cpu_stat_per_version() -> None:
    v1 = parse_cpu_stat("nr_periods 200\nnr_throttled 50\nthrottled_time 2500000000\n"
                        "nr_bursts 0\nburst_time 0\n", 1)
    assert v1 == Throttling(200, 50, 2.5) and v1.throttled_share == 0.25
    v2 = parse_cpu_stat("usage_usec 900\nuser_usec 800\nsystem_usec 100\nnr_periods 10\n"
                        "nr_throttled 1\nthrottled_usec 1500000\n", 2)
    assert v2 == Throttling(10, 1, 1.5)
    assert parse_cpu_stat("", 2).throttled_share is None


def test_a_cgroup_on_a_fake_v1_root(tmp_path: Path) -> None:
    mounts, v1, _ = _fake_root(tmp_path, "hugetlb")
    ctrl = find_cpu_controller(mounts)
    assert isinstance(ctrl, CpuController)
    cg = RankCgroup.create("otab1", 0.7, ctrl, cpus=2)
    assert cg.path == v1 / "opus-testbed-otab1"
    assert (cg.path / "cpu.cfs_quota_us").read_text() == "140000"
    assert (cg.path / "cpu.cfs_period_us").read_text() == "100000"
    (cg.path / "cpu.stat").write_text("nr_periods 4\nnr_throttled 1\nthrottled_time 1000\n")
    summary = cg.summary(cg.throttling())
    assert summary is not None
    assert (summary["cgroup"], summary["cgroup_version"], summary["cores"],
            summary["throttled_share"]) == ("opus-testbed-otab1", 1, 1.4, 0.25)
    with pytest.raises(CgroupUnavailable, match="opus-testbed-otab1"):
        RankCgroup.create("otab1", 0.7, ctrl, cpus=2)  # one cgroup per run prefix


def test_a_cgroup_on_a_fake_v2_root_that_hands_out_cpu(tmp_path: Path) -> None:
    mounts, _, v2 = _fake_root(tmp_path, "cpu memory")
    (v2 / "cgroup.subtree_control").write_text("cpu memory\n")
    ctrl = find_cpu_controller(mounts)
    assert isinstance(ctrl, CpuController)
    cg = RankCgroup.create("otab2", AUTO, ctrl, cpus=4)
    assert (v2 / "cgroup.subtree_control").read_text() == "cpu memory\n"  # left as it was
    assert cg.fraction == pytest.approx(1 - cpuquota.AUTO_RESERVE_CORES / 4)
    assert (cg.path / "cpu.max").read_text() == f"{round(cg.fraction * 400_000)} 100000"


def test_a_v2_root_that_does_not_hand_out_cpu_is_refused_and_left_alone(tmp_path: Path) -> None:
    """Turning the controller on would change the machine's cgroups for good (and a
    container's root cannot): the run is refused with the command that would do it."""
    mounts, _, v2 = _fake_root(tmp_path, "cpu memory")
    (v2 / "cgroup.subtree_control").write_text("memory\n")
    ctrl = find_cpu_controller(mounts)
    assert isinstance(ctrl, CpuController)
    with pytest.raises(CgroupUnavailable, match=r"does not hand out the cpu controller.*\+cpu"):
        RankCgroup.create("otab3", 0.5, ctrl, cpus=2)
    assert (v2 / "cgroup.subtree_control").read_text() == "memory\n"
    assert not (v2 / "opus-testbed-otab3").exists()


def test_placed_command_writes_its_pid_before_it_runs(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    out = subprocess.run(placed_command(procs, ["sh", "-c", 'echo "$$ $0"', "named"]),
                         capture_output=True, text=True, check=True).stdout.split()
    assert procs.read_text().split() == [out[0]]  # the same pid: exec, not a child
    assert out[1] == "named"
    failed = subprocess.run(placed_command(tmp_path / "missing" / "cgroup.procs", ["true"]),
                            capture_output=True, check=False)
    assert failed.returncode != 0


def test_a_path_seen_from_another_mount_namespace(tmp_path: Path) -> None:
    seen = cpuquota.seen_from_anywhere(tmp_path / "cgroup.procs")
    assert seen == Path(f"/proc/{os.getpid()}/root{tmp_path}/cgroup.procs")
    (tmp_path / "cgroup.procs").write_text("1\n")
    assert seen.read_text() == "1\n"


def test_quota_lines() -> None:
    assert quota_summary(None, None, 2, None, None, None) is None
    assert quota_text(None).startswith("off")
    unread = quota_summary("auto", 0.7, 2, "opus-testbed-otabc", 2, None)
    assert quota_text(unread).endswith("throttling not read")


def test_owned_cgroup_needs_our_name_under_a_mounted_root(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    mounts, v1, _ = _fake_root(tmp_path, "hugetlb")
    table = tmp_path / "mounts"
    table.write_text(mounts)
    monkeypatch.setattr(cpuquota, "MOUNTS", table)
    assert cpuquota.owned_cgroup(v1 / "opus-testbed-otab4", "otab4")
    assert not cpuquota.owned_cgroup(v1 / "opus-testbed-otab4", "otab5")  # another run's
    assert not cpuquota.owned_cgroup(v1 / "x" / "opus-testbed-otab4", "otab4")  # not at root
    assert not cpuquota.owned_cgroup(tmp_path / "opus-testbed-otab4", "otab4")
    assert not cpuquota.owned_cgroup(v1 / "user.slice", "otab4")


def test_remove_cgroup_of_an_empty_directory(tmp_path: Path) -> None:
    path = tmp_path / "opus-testbed-otab6"
    path.mkdir()
    assert cpuquota.remove_cgroup(path) == [] and not path.exists()
    assert cpuquota.remove_cgroup(path) == []  # gone already
    assert os.getpid() not in cpuquota.member_pids(path)
