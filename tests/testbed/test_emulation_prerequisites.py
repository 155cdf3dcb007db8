"""tests/emulation/conftest.py: under CI a missing prerequisite fails the run; elsewhere it skips.

Each case runs pytest on one emulation test file in a subprocess with ``OVS_RUNDIR`` pointing
at an empty directory, so Open vSwitch is "not running" for it (``ovs-vsctl`` finds no socket
there). ``--setup-only`` keeps test bodies from running even if a skip went missing, so no
network is ever started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.check import check_ovs

ROOT = Path(__file__).resolve().parents[2]
ONE_EMULATION_FILE = "tests/emulation/test_clean.py"  # one test, builds a network if it runs


def run_emulation_tests(ovs_rundir: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(OVS_RUNDIR=str(ovs_rundir), COLUMNS="500")
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--setup-only", "-rs", ONE_EMULATION_FILE], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120, check=False)


def ovs_fix(ovs_rundir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """What `opus-testbed check` tells to do when Open vSwitch is not at ``ovs_rundir``."""
    monkeypatch.setenv("OVS_RUNDIR", str(ovs_rundir))
    check = check_ovs()
    assert not check.ok and check.fix, check
    return check.fix


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_missing_open_vswitch_fails_the_run_with_the_fix(
        ci: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = run_emulation_tests(tmp_path, ci)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "CI=true but the emulation tests cannot run" in out
    assert ovs_fix(tmp_path, monkeypatch) in out
    assert "no tests ran" in out  # stopped at collection, before any test


@pytest.mark.parametrize("ci", [None, "false"])
def test_without_ci_missing_open_vswitch_skips_with_the_reason(
        ci: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = run_emulation_tests(tmp_path, ci)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    summary = next(line for line in reversed(res.stdout.splitlines()) if " in " in line)
    assert summary.strip("= ").startswith("1 skipped in"), out  # nothing passed, failed, errored
    assert "SKIPPED [1] tests/emulation/test_clean.py: emulation prerequisites missing" in out
    assert "openvswitch: ovs-vswitchd/ovsdb not answering" in out
    assert ovs_fix(tmp_path, monkeypatch) in out



@pytest.mark.parametrize(("value", "ci"), [
    ("true", True), ("1", True), (" TRUE ", True), ("yes", True), ("on", True),
    ("", False), ("0", False), ("false", False), ("no", False), (None, False)])
def test_ci_is_detected_by_one_rule(value: str | None, ci: bool) -> None:
    """``CI=1`` and ``CI=true`` both mean CI, for the emulation prerequisites and the torch
    tests alike (testbed.check.ci_requested is the only reader of ``CI``)."""
    from testbed.check import ci_requested

    env = {} if value is None else {"CI": value}
    assert ci_requested(env) is ci


def test_nothing_else_reads_the_ci_variable() -> None:
    readers = []
    for path in [*ROOT.glob("testbed/**/*.py"), *ROOT.glob("tests/**/*.py")]:
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        if 'environ.get("CI"' in text or "environ['CI']" in text or 'environ["CI"]' in text:
            readers.append(str(path.relative_to(ROOT)))
    assert readers == []
