"""emulator.runstate: run records on disk and guarded process stopping."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
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


SLEEP_ARG = "30.0417"  # recognisable in /proc/PID/cmdline


class WatchedSleep:
    """``sleep 30.0417`` started by a shell that prints the sleep's pid, then how it ended.

    The shell is the sleep's parent, so ``stop_process`` cannot reap it, and the shell's
    ``wait`` reports which signal ended it: an observer apart from the code under test.
    """

    def __init__(self) -> None:
        self.shell = subprocess.Popen(
            ["sh", "-c", f"sleep {SLEEP_ARG} & echo $!; wait $!; echo $?"],
            stdout=subprocess.PIPE, text=True)
        assert self.shell.stdout is not None
        self.pid = int(self.shell.stdout.readline())
        deadline = time.monotonic() + 10
        # Until exec has replaced sh's image: the forked shell's own command line holds
        # "sleep 30.0417" too, and a check caught mid-exec reads an empty command line.
        while runstate.cmdline(self.pid).split() != ["sleep", SLEEP_ARG]:
            assert time.monotonic() < deadline, f"pid {self.pid} never became sleep {SLEEP_ARG}"
            time.sleep(0.005)

    def ending_signal(self) -> int:
        """The signal that ended the sleep, as its parent shell saw it."""
        out, _ = self.shell.communicate(timeout=10)
        status = int(out.split()[-1])
        assert status > 128, f"sleep exited with status {status}, not by a signal"
        return status - 128

    def close(self) -> None:
        """End the sleep (if still ours and alive) and its shell."""
        if SLEEP_ARG in runstate.cmdline(self.pid):
            os.kill(self.pid, signal.SIGKILL)
        self.shell.communicate(timeout=10)


@pytest.fixture
def watched_sleep() -> Iterator[WatchedSleep]:
    sleeper = WatchedSleep()
    try:
        yield sleeper
    finally:
        sleeper.close()


def test_stop_process_refuses_pid_without_marker(watched_sleep: WatchedSleep) -> None:
    assert not runstate.stop_process(watched_sleep.pid, "opus-marker-not-there", timeout_s=0.5)
    # Now end it ourselves with a signal stop_process never sends. A signal it had sent would
    # have decided the exit already (a default-action fatal signal sets the exit code when it
    # is sent), and SIGVTALRM is numbered above SIGTERM, so it could not be delivered first.
    os.kill(watched_sleep.pid, signal.SIGVTALRM)
    assert watched_sleep.ending_signal() == signal.SIGVTALRM, (
        "a process without the marker must not be signalled")


def test_stop_process_stops_pid_with_marker(watched_sleep: WatchedSleep) -> None:
    assert runstate.stop_process(watched_sleep.pid, f"sleep {SLEEP_ARG}", timeout_s=3.0)
    assert SLEEP_ARG not in runstate.cmdline(watched_sleep.pid)
    ended_by = signal.Signals(watched_sleep.ending_signal())
    assert ended_by == signal.SIGTERM, f"sleep ended by {ended_by.name}: SIGTERM is enough"


def test_stop_process_of_dead_pid_is_false() -> None:
    proc = subprocess.Popen(["sleep", SLEEP_ARG])
    proc.kill()
    proc.wait()
    assert not runstate.stop_process(proc.pid, "sleep")


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_an_owned_dir_is_recorded_while_in_use_and_removed_after(state_dir: Path,
                                                                  tmp_path: Path) -> None:
    with runstate.owned_dir(tmp_path / "run" / "scaleup") as d:
        (d / "r0.sock").write_text("")
        assert d.is_dir() and len(list(runstate.dirs_dir().glob("*.json"))) == 1
        assert runstate.clean_dirs() == []  # its owner (this process) is alive
        assert d.is_dir()
    assert not d.exists() and not list(runstate.dirs_dir().glob("*.json"))


def test_clean_removes_recorded_dirs_of_dead_owners_only(state_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    dead, marked, unmarked = _dead_pid(), tmp_path / "killed", tmp_path / "not-ours"
    for d in (marked, unmarked):
        d.mkdir()
        (d / "r0.sock").write_text("")
    (marked / runstate.DIR_MARKER).write_text("")
    runstate.dirs_dir().mkdir(parents=True)
    for i, d in enumerate((marked, unmarked)):  # the second lacks the marker: not touched
        (runstate.dirs_dir() / f"{dead}-{i}.json").write_text(
            f'{{"owner_pid": {dead}, "path": "{d}"}}')
    stranger = tmp_path / "never-recorded"
    stranger.mkdir()
    (stranger / runstate.DIR_MARKER).write_text("")
    # only the directory part of `clean`: no bridge or link of other runs may be touched here
    monkeypatch.setattr(runstate, "owned_bridges", lambda: [])
    monkeypatch.setattr(runstate, "owned_links", lambda: [])
    removed = runstate.clean()
    assert removed["dirs"] == [str(marked)]
    assert not marked.exists() and unmarked.is_dir() and stranger.is_dir()
    assert not list(runstate.dirs_dir().glob("*.json"))


def test_a_record_keeps_its_cgroups_and_an_older_record_loads_without(state_dir: Path) -> None:
    rec = RunRecord("ot1a3", owner_pid=4242, cgroups=["/sys/fs/cgroup/opus-testbed-ot1a3"])
    rec.save()
    assert RunRecord.load(rec.path).cgroups == rec.cgroups
    rec.path.write_text('{"prefix": "ot1a3", "owner_pid": 1, "processes": [], "bridges": []}')
    assert RunRecord.load(rec.path).cgroups == []


def test_clean_removes_only_a_recorded_cgroup_named_as_the_runs(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fake cgroup root: the dead run's own cgroup goes; a directory its record names but
    that is not its cgroup (another name, or not at a hierarchy's root) stays."""
    from emulator import cpuquota

    root = tmp_path / "cpu"
    ours, other, deep = (root / "opus-testbed-ot1a4", root / "user.slice",
                         root / "x" / "opus-testbed-ot1a4")
    for path in (ours, other, deep):
        path.mkdir(parents=True)
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup {root} cgroup rw,cpu 0 0\n")
    monkeypatch.setattr(cpuquota, "MOUNTS", mounts)
    dead = subprocess.Popen(["true"])
    dead.wait()
    RunRecord("ot1a4", owner_pid=dead.pid, cgroups=[str(ours), str(other), str(deep)]).save()
    # only the cgroup part of `clean`: no bridge or link of other runs may be touched here
    monkeypatch.setattr(runstate, "owned_bridges", lambda: [])
    monkeypatch.setattr(runstate, "owned_links", lambda: [])
    removed = runstate.clean()
    assert removed["cgroups"] == [str(ours)] and removed["records"] == ["ot1a4"]
    assert not ours.exists() and other.is_dir() and deep.is_dir()
