"""The README's quick start, run as written (its no-root commands, on the sim backend)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def quick_start_commands() -> list[str]:
    """The lines of the quick start's ``sh`` block, comments removed."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the quick start has no sh block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_quick_start_is_short_and_near_the_top() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert text.index("## Quick start") < 200 and len(section.strip().splitlines()) < 25


def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    """cp, run --backend sim --baseline and sweep --backend sim, in a fresh directory; the
    emulator line (sudo) is left to the emulation tests."""
    commands = quick_start_commands()
    assert commands[0] == "cp examples/tiny.yaml my.yaml"
    assert any(c.startswith("sudo ") and "--backend" not in c for c in commands)
    shutil.copy(ROOT / "examples" / "tiny.yaml", tmp_path / "my.yaml")
    ran = 0
    for command in commands[1:]:
        words = shlex.split(command)
        if words[0] == "sudo":
            continue
        assert words[0] == "opus-testbed" and "--backend" in words and "sim" in words
        res = subprocess.run([sys.executable, "-m", "testbed.cli.main", *words[1:]],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300,
                             check=False, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert res.returncode == 0, f"{command}\n{res.stdout}\n{res.stderr}"
        ran += 1
    assert ran == 2
    run = tmp_path / "results" / "my-sim"
    for mode in ("baseline", "provisioning"):  # what the text says is there
        for name in ("summary.json", "timeline.png", "windows_cdf.png"):
            assert (run / mode / name).exists(), (mode, name)
    summary = json.loads((run / "provisioning" / "summary.json").read_text())
    assert summary["fidelity"] == "simulated" and summary["overhead_pct"] > 0
    sweep = json.loads((tmp_path / "results" / "my-sweep" / "sweep.json").read_text())
    assert all(f["slope_s_per_s"] for f in sweep["families"])  # the default grid's slope
    assert (tmp_path / "results" / "my-sweep" / "iteration_vs_delay.png").exists()
