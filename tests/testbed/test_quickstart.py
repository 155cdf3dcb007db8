"""The README's quick start, run as written: each of its lines verbatim in a fresh login shell
(``bash -lc``), with the PATH a new shell gets, in a fresh folder (issue 36, item 1).

Lines that start with ``sudo`` are not run here, and each is accounted for: ``sudo make setup``
is what ``make test`` has just run (the link it makes is tested below through
``scripts/link-cli.sh``, and the fresh shell must find ``opus-testbed`` by it); the emulator
line needs root, Mininet and Open vSwitch, and ``tests/emulation/test_run_emulated.py`` runs the
same file on the emulator.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed.check import ci_requested

ROOT = Path(__file__).resolve().parents[2]
LINK_CLI = ROOT / "scripts" / "link-cli.sh"
SKIPPED = {"sudo make setup": "make test runs the set-up first",
           "sudo opus-testbed run": "the emulator needs root (tests/emulation)"}


def quick_start_lines() -> list[str]:
    """The lines of the quick start's ``sh`` block, verbatim (comments included)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the quick start has no sh block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def _fresh_shell(line: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """``line`` in a new login shell: the PATH is the one /etc/profile gives any new shell,
    nothing of this test's environment but PYTHONPATH (this checkout's code, whichever clone's
    venv the link points to)."""
    env = {"HOME": str(home), "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8", "USER": "root"}
    return subprocess.run(["bash", "-lc", line], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_quick_start_is_short_and_near_the_top() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert text.index("## Quick start") < 200 and len(section.strip().splitlines()) < 30


def test_the_quick_start_runs_as_written_in_a_fresh_shell(tmp_path: Path) -> None:
    """Its set-up first, then ``cp``, ``run --backend sim --baseline`` and ``sweep --backend
    sim``, verbatim, in a folder that holds only the clone's ``examples/`` (the block runs in
    the clone's folder; its outputs go under this folder's ``results/``)."""
    lines = quick_start_lines()
    assert lines[0].startswith("sudo make setup"), "the set-up is the first command"
    work, home = tmp_path / "clone", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    found = _fresh_shell("command -v opus-testbed", work, home)
    if found.returncode != 0:
        why = ("opus-testbed is not on a new shell's PATH: run `sudo make setup` "
               "(scripts/setup.sh links it into /usr/local/bin)")
        if ci_requested():
            pytest.fail(why)
        pytest.skip(why)
    ran = []
    for line in lines:
        if line.startswith("sudo "):
            assert any(line.startswith(k) for k in SKIPPED), f"unaccounted root line: {line}"
            continue
        res = _fresh_shell(line, work, home)
        assert res.returncode == 0, f"{line}\n{res.stdout}\n{res.stderr}"
        ran.append(line.split()[0:2])
    assert ran == [["cp", "examples/tiny.yaml"], ["opus-testbed", "run"],
                   ["opus-testbed", "sweep"]]
    run = work / "results" / "my-sim"
    for mode in ("baseline", "provisioning"):  # what the text says is there
        for name in ("summary.json", "timeline.png", "windows_cdf.png"):
            assert (run / mode / name).exists(), (mode, name)
    summary = json.loads((run / "provisioning" / "summary.json").read_text())
    assert summary["fidelity"] == "simulated" and summary["overhead_pct"] > 0
    sweep = json.loads((work / "results" / "my-sweep" / "sweep.json").read_text())
    assert all(f["slope_s_per_s"] for f in sweep["families"])  # the default grid's slope
    assert (work / "results" / "my-sweep" / "iteration_vs_delay.png").exists()
    # a second run is refused, not overwritten: another --out is needed
    again = _fresh_shell(next(x for x in lines if " run " in x and "--backend sim" in x),
                         work, home)
    assert again.returncode == 2 and "choose another --out" in again.stderr


def _link(target: Path, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(LINK_CLI), str(target)], capture_output=True,
                          text=True, timeout=30, check=False,
                          env={**os.environ, "OPUS_BIN_DIR": str(bin_dir)})


def test_the_set_up_links_the_command_once_and_leaves_other_files_alone(
        tmp_path: Path) -> None:
    """scripts/link-cli.sh (the set-up's last step): links, then finds its link there; moves
    a link of another clone to this one; never replaces a file that is not a link."""
    venv_bin = tmp_path / "clone" / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    entry = venv_bin / "opus-testbed"
    entry.write_text("#!/bin/sh\necho opus\n")
    entry.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    first = _link(entry, bin_dir)
    assert first.returncode == 0 and "linked" in first.stdout
    assert os.readlink(bin_dir / "opus-testbed") == str(entry)
    again = _link(entry, bin_dir)
    assert again.returncode == 0 and "on the PATH" in again.stdout
    other = tmp_path / "other" / "opus-testbed"
    other.parent.mkdir()
    shutil.copy(entry, other)
    moved = _link(other, bin_dir)
    assert f"(was {entry})" in moved.stdout and os.readlink(bin_dir / "opus-testbed") == str(
        other)
    (bin_dir / "opus-testbed").unlink()
    (bin_dir / "opus-testbed").write_text("someone else's\n")
    kept = _link(entry, bin_dir)
    assert kept.returncode == 0 and "left as is" in kept.stdout
    assert (bin_dir / "opus-testbed").read_text() == "someone else's\n"
    missing = _link(tmp_path / "nowhere" / "opus-testbed", bin_dir)
    assert missing.returncode == 1 and "not an executable" in missing.stderr
