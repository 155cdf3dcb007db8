"""emulator.runstate: run records on disk and guarded process stopping."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from emulator import runstate
from emulator.runstate import RecordedProcess, RunRecord


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point OPUS_STATE_DIR at a fresh temporary directory."""
    d = tmp_path / "state"
    monkeypatch.setenv("OPUS_STATE_DIR", str(d))
    return d


def test_state_dir_follows_env(state_dir: Path) -> None:
    assert runstate.state_dir() == state_dir
    assert RunRecord("ot1a2", 1).path == state_dir / "ot1a2.json"


def test_record_save_load_round_trip(state_dir: Path) -> None:
    rec = RunRecord("ot1a2", owner_pid=4242, slot=7, created_s=123.5,
                    processes=[RecordedProcess(11, "mininet:ot1a2")], bridges=["ot1a2r0"])
    rec.save()
    assert rec.path.is_file()
    assert not list(state_dir.glob("*.tmp"))
    assert RunRecord.load(rec.path) == rec


def test_add_process_persists_and_remove_deletes(state_dir: Path) -> None:
    rec = RunRecord("ot0ff", owner_pid=1)
    rec.save()
    rec.add_process(99, "probe record")
    assert RunRecord.load(rec.path).processes == [RecordedProcess(99, "probe record")]
    rec.remove()
    assert not rec.path.exists()
    rec.remove()  # a second remove is harmless


def test_load_records_without_dir_is_empty(state_dir: Path) -> None:
    assert not state_dir.exists()
    assert runstate.load_records() == []


@pytest.mark.parametrize(
    "junk",
    ["not json", "", "[]", "{}", '{"prefix": "ot00a"}', '{"prefix": "ot00a", "owner_pid": 1, '
     '"processes": [1]}', '{"prefix": "ot00a", "owner_pid": 1, "colour": "red"}', "\xff\xfe"],
)
def test_load_records_ignores_junk_files(state_dir: Path, junk: str) -> None:
    good = RunRecord("ot1a2", owner_pid=5, created_s=1.0)
    good.save()
    (state_dir / "ot00a.json").write_text(junk, encoding="latin-1")
    (state_dir / "notes.json").write_text("{}")
    (state_dir / "ot1a2.tmp").write_text("partial")
    assert runstate.load_records() == [good]


@pytest.mark.parametrize("junk", ["42", "null", '"ot00a"', "true", "1.5"])
def test_load_records_ignores_json_that_is_not_an_object(state_dir: Path, junk: str) -> None:
    good = RunRecord("ot1a2", owner_pid=5, created_s=1.0)
    good.save()
    (state_dir / "ot00a.json").write_text(junk)
    assert runstate.load_records() == [good]


def test_load_records_ignores_directory_named_like_record(state_dir: Path) -> None:
    good = RunRecord("ot1a2", owner_pid=5, created_s=1.0)
    good.save()
    (state_dir / "ot00a.json").mkdir()
    assert runstate.load_records() == [good]


def test_load_records_returns_all_records_sorted(state_dir: Path) -> None:
    recs = [RunRecord(p, owner_pid=1, created_s=0.0) for p in ("otfff", "ot000", "ot7a0")]
    for r in recs:
        r.save()
    assert [r.prefix for r in runstate.load_records()] == ["ot000", "ot7a0", "otfff"]


def test_pid_alive_and_cmdline_of_self() -> None:
    assert runstate.pid_alive(os.getpid())
    assert "python" in runstate.cmdline(os.getpid()) or "pytest" in runstate.cmdline(os.getpid())
    assert runstate.cmdline(2**22 + 12345) == ""


def start_sleep() -> subprocess.Popen[bytes]:
    """A child we own: ``sleep 30`` with a recognisable argument."""
    return subprocess.Popen(["sleep", "30.0417"])


def test_stop_process_refuses_pid_without_marker() -> None:
    proc = start_sleep()
    try:
        assert not runstate.stop_process(proc.pid, "opus-marker-not-there", timeout_s=0.5)
        time.sleep(0.05)
        assert proc.poll() is None, "a process without the marker must not be signalled"
    finally:
        proc.kill()
        proc.wait()


def test_stop_process_stops_pid_with_marker() -> None:
    proc = start_sleep()
    try:
        for _ in range(100):  # wait until exec has replaced the forked python image
            if "30.0417" in runstate.cmdline(proc.pid):
                break
            time.sleep(0.01)
        t0 = time.monotonic()
        assert runstate.stop_process(proc.pid, "sleep 30.0417", timeout_s=3.0)
        assert time.monotonic() - t0 < 2.0, "SIGTERM should be enough for sleep"
        assert proc.wait(timeout=2) is not None
        assert "30.0417" not in runstate.cmdline(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_stop_process_of_dead_pid_is_false() -> None:
    proc = start_sleep()
    proc.kill()
    proc.wait()
    assert not runstate.stop_process(proc.pid, "sleep")
