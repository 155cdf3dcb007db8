"""The profiler recipe of docs/imports.md, run as written: torchrun, ``import kineto``, a sim run.

Needs torch in the test's interpreter; without it the test is skipped, except under CI
(``CI=true``) once the project declares its ``torch`` extra: then a missing torch fails.
``torchrun`` and ``opus-testbed`` are run as ``python -m torch.distributed.run`` and
``python -m testbed.cli.main`` of this interpreter; globs are expanded as a shell would.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from testbed.check import ci_requested

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = {"torchrun": [sys.executable, "-m", "torch.distributed.run"],
            "opus-testbed": [sys.executable, "-m", "testbed.cli.main"]}


def _recipe() -> tuple[str, list[str]]:
    """The recipe's Python file and its shell lines (comments removed)."""
    text = (ROOT / "docs" / "imports.md").read_text()
    section = text.split("**A profiler recipe**", 1)[1].split("\n## ", 1)[0]
    script = section.split("```python\n", 1)[1].split("```", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [ln.split("#")[0].strip() for ln in block.splitlines()]
    return script, [ln for ln in lines if ln]


def _require_torch() -> None:
    if importlib.util.find_spec("torch") is not None:
        return
    with open(ROOT / "pyproject.toml", "rb") as fh:
        extras = tomllib.load(fh)["project"].get("optional-dependencies", {})
    why = f"torch is not installed for {sys.executable}"
    if ci_requested() and "torch" in extras:
        pytest.fail(f"CI=true and the project declares torch, but {why} "
                    "(fix: bash scripts/setup.sh)")
    pytest.skip(why)


def test_the_recipe_is_short() -> None:
    script, lines = _recipe()
    assert len(script.strip().splitlines()) <= 16  # 15 before os._exit (the page says why)
    assert [ln.split()[0] for ln in lines] == ["torchrun", "opus-testbed", "opus-testbed"]


def test_the_recipe_runs_as_written(tmp_path: Path) -> None:
    _require_torch()
    script, lines = _recipe()
    (tmp_path / "profile_ddp.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for line in lines:
        argv = shlex.split(line)
        args = [a for arg in argv[1:]
                for a in (sorted(glob.glob(arg, root_dir=tmp_path)) if "*" in arg else [arg])]
        done = subprocess.run([*PROGRAMS[argv[0]], *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        if argv[0] == "torchrun":
            assert sorted(p.name for p in tmp_path.glob("rank*.json")) == ["rank0.json",
                                                                          "rank1.json"]
        elif "import" in argv:
            assert "ProfilerStep 2" in done.stdout and "groups: dp 2" in done.stdout
    summary = json.loads(next(tmp_path.glob("results/**/summary.json")).read_text())
    assert summary["world_size"] == 2 and summary["calls_delivered"] == summary["calls"] > 0
