"""`opus-testbed run` when Open vSwitch is not running: the error and the way out, exit 1.

Here, not in tests/testbed: the run needs root before it looks for Open vSwitch, and this
folder's prerequisites (root, Mininet, Open vSwitch) fail the run under CI instead of skipping.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_run_without_open_vswitch_says_so_without_a_traceback(tmp_path: Path) -> None:
    rundir = tmp_path / "ovs"
    rundir.mkdir()
    env = {**os.environ, "OVS_RUNDIR": str(rundir)}
    res = subprocess.run([sys.executable, "-m", "testbed.cli.main", "run", "examples/tiny.yaml",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=120, check=False)
    assert res.returncode == 1, res.stderr
    assert "error: Open vSwitch is not running" in res.stderr
    assert "scripts/setup.sh" in res.stderr  # the way out
    assert "Traceback" not in res.stderr
