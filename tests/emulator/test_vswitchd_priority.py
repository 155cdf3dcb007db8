"""emulator.vswitchd_priority on a stand-in daemon (a child process of the test, named by a
pidfile in a temporary OVS run directory): raised while runs hold it, restored by the last."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator import vswitchd_priority
from emulator.runstate import RunRecord

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="setting SCHED_FIFO needs root (CI runs as root)")


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A sleeping child standing in for ovs-vswitchd, and fresh state and run directories."""
    monkeypatch.setenv("OPUS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("OVS_RUNDIR", str(tmp_path / "ovs"))
    proc = subprocess.Popen(["sleep", "600"])
    (tmp_path / "ovs").mkdir()
    (tmp_path / "ovs" / "ovs-vswitchd.pid").write_text(f"{proc.pid}\n")
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


def live_run(prefix: str) -> None:
    RunRecord(prefix, owner_pid=os.getpid()).save()


def test_raised_while_any_run_holds_it_and_restored_by_the_last(daemon: int) -> None:
    live_run("ota01")
    live_run("ota02")
    assert "SCHED_FIFO" in vswitchd_priority.raise_priority("ota01")
    assert os.sched_getscheduler(daemon) == os.SCHED_FIFO
    assert os.sched_getparam(daemon).sched_priority == vswitchd_priority.VSWITCHD_PRIORITY
    vswitchd_priority.raise_priority("ota02")
    assert not vswitchd_priority.release("ota01"), "released while ota02 still holds it"
    assert os.sched_getscheduler(daemon) == os.SCHED_FIFO
    assert vswitchd_priority.release("ota02")
    assert os.sched_getscheduler(daemon) == os.SCHED_OTHER


def test_a_dead_runs_hold_is_dropped_by_clean(daemon: int) -> None:
    vswitchd_priority.raise_priority("ota03")  # no live record: its owner is gone
    assert os.sched_getscheduler(daemon) == os.SCHED_FIFO
    assert vswitchd_priority.release()  # what ``opus-testbed clean`` calls
    assert os.sched_getscheduler(daemon) == os.SCHED_OTHER
    assert not vswitchd_priority.release(), "nothing left to restore"


def test_a_policy_set_by_someone_else_is_left_alone(daemon: int) -> None:
    os.sched_setscheduler(daemon, os.SCHED_RR, os.sched_param(3))
    live_run("ota04")
    assert "left as it is" in vswitchd_priority.raise_priority("ota04")
    assert not vswitchd_priority.release("ota04")
    assert os.sched_getscheduler(daemon) == os.SCHED_RR


def test_a_policy_changed_during_the_run_is_not_undone(daemon: int) -> None:
    live_run("ota05")
    vswitchd_priority.raise_priority("ota05")
    os.sched_setscheduler(daemon, os.SCHED_BATCH, os.sched_param(0))
    assert not vswitchd_priority.release("ota05")
    assert os.sched_getscheduler(daemon) == os.SCHED_BATCH


def test_no_daemon_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPUS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("OVS_RUNDIR", str(tmp_path / "none"))
    assert "not found" in vswitchd_priority.raise_priority("ota06")
    assert not (tmp_path / "state" / vswitchd_priority.STATE_NAME).exists()
