"""The shipped torch job profiled with torch.profiler here, imported, and run on the sim backend.

Needs torch in the test's interpreter and the shipped job (``examples/torch/train_llama_tiny
.py``). Without them the test is skipped, except under CI (``CI=true``) once the project
declares its ``torch`` extra (``scripts/setup.sh`` installs it): then a missing torch fails.
The data-parallel and pipeline groups, sizes and counts are those of
``data/kineto-fsdp2-pp2`` (the same job and arguments, profiled by the research prototype).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from testbed.check import ci_requested
from testbed.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "examples" / "torch" / "train_llama_tiny.py"
PROFILE = Path(__file__).parent / "profile_job.py"
ARGS = ["--steps", "2", "--layers", "2", "--microbatches", "2", "--seq", "16", "--dim", "64",
        "--ffn", "128", "--vocab", "128"]
RUN_TIMEOUT_S = 300.0


def _require_torch_job() -> None:
    missing = []
    if importlib.util.find_spec("torch") is None:
        missing.append(f"torch is not installed for {sys.executable}")
    if not SHIPPED.exists():
        missing.append(f"the shipped job {SHIPPED.relative_to(ROOT)} is missing")
    if not missing:
        return
    with open(ROOT / "pyproject.toml", "rb") as fh:
        extras = tomllib.load(fh)["project"].get("optional-dependencies", {})
    if ci_requested() and "torch" in extras:
        pytest.fail(f"CI=true and the project declares torch, but {'; '.join(missing)} "
                    "(fix: bash scripts/setup.sh)")
    pytest.skip("; ".join(missing))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _profile_job(out: Path) -> None:
    """Four ranks of the shipped job on loopback gloo, each writing its trace into ``out``."""
    env = {**os.environ, "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in range(4):
        log = open(out / f"log{rank}.txt", "w")  # noqa: SIM115 (closed below)
        procs.append((subprocess.Popen(
            [sys.executable, str(PROFILE), str(out), str(SHIPPED), *ARGS],
            env={**env, "RANK": str(rank)}, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        for proc, _ in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    failed = {r: (out / f"log{r}.txt").read_text()[-2000:] for r, (p, _) in enumerate(procs)
              if p.returncode != 0}
    assert not failed, f"profiled ranks failed: {failed}"


@pytest.mark.slow
def test_a_profiled_run_of_the_shipped_job_imports_and_runs_on_the_sim_backend(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _require_torch_job()
    traces = tmp_path / "traces"
    traces.mkdir()
    _profile_job(traces)
    paths = [str(traces / f"rank{r}.json") for r in range(4)]
    assert main(["import", "kineto", *paths, "--out", str(tmp_path / "imp"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep["layouts"].values()) == {"L3"} and rep["iteration"] == "ProfilerStep 1"
    schedule_file = tmp_path / "imp" / "workload.json"
    from workloads.schedule import load

    s = load(schedule_file)
    assert s.groups["pp"].ranks.tolist() == [[0, 2], [1, 3]]
    assert s.groups["fsdp"].ranks.tolist() == [[0, 1], [2, 3]]
    for rank in range(4):
        assert Counter((o.axis, o.kind) for o in s.ops_of(rank) if o.is_collective) == {
            ("fsdp", "all_gather"): 6, ("fsdp", "reduce_scatter"): 2,
            ("pp", "send"): 2, ("pp", "recv"): 2}
    code = main(["run", str(tmp_path / "imp" / "experiment.yaml"), "--backend", "sim",
                 "--json", "--out", str(tmp_path / "run")])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["all_iterations_completed"] is True
    assert summary["calls_delivered"] == summary["calls"] == 3 * 4 * 12
