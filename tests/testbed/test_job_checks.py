"""Every job check runs before anything starts (issue 36, item 4): a job the rails cannot
carry is refused with exit 2 before the baseline (or a sweep's first point) runs, and the
refusal names the group, the calls that need the circuits and the setting that fixes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pp4(tmp_path: Path) -> Path:
    """tiny.yaml with PP=4 on its one rail: the pipeline's gradient-norm all-reduce is a ring
    of four, which needs two circuits per rank (K=1 has one port)."""
    text = (ROOT / "examples" / "tiny.yaml").read_text()
    assert "fsdp: 2, pp: 2" in text
    path = tmp_path / "pp4.yaml"
    path.write_text(text.replace("fsdp: 2, pp: 2", "fsdp: 1, pp: 4"))
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_a_job_the_rails_cannot_carry_is_refused_before_the_baseline_runs(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = _cli("run", str(_pp4(tmp_path)), "--backend", "sim", "--baseline", "--out", str(out),
               cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert not out.exists(), "the baseline ran (or its folder was made) before the refusal"
    assert "simulated" not in res.stderr  # no run's progress line
    err = res.stderr
    for words in ("comm group pp0", "all_reduce", "rank 0 needs 2 circuits on rail 0",
                  "to ranks 1 and 3", "owns 1 port(s)", "--ports-per-rank 2",
                  "ocs.ports_per_rank: 2"):
        assert words in err, (words, err)
    # the setting it names fixes it: the retry with the same --out runs
    res = _cli("run", str(_pp4(tmp_path)), "--backend", "sim", "--baseline", "--out", str(out),
               "--ports-per-rank", "2", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (out / "baseline" / "summary.json").exists()
    assert (out / "provisioning" / "summary.json").exists()


def test_a_busy_run_folder_is_refused_before_the_baseline_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "provisioning").mkdir(parents=True)
    (out / "provisioning" / "left-over").write_text("x")
    res = _cli("run", str(ROOT / "examples" / "tiny.yaml"), "--backend", "sim", "--baseline",
               "--out", str(out), cwd=tmp_path)
    assert res.returncode == 2 and "provisioning exists and is not empty" in res.stderr
    assert not (out / "baseline").exists()


def test_a_sweep_checks_every_mode_before_its_first_point(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    res = _cli("sweep", str(_pp4(tmp_path)), "--backend", "sim", "--delays", "0,10",
               "--out", str(out), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "--ports-per-rank 2" in res.stderr and not out.exists()


def test_the_shortfall_names_the_k_that_carries_every_group() -> None:
    """Two groups on one rail: a ring of four (2 circuits per rank) and a full mesh of four
    given as pairs (3 at each rank): the refusal is about the first, the fix is K=3."""
    from controller.job import CommGroup, rail_job_ports
    from testbed.plan.replay import PlanError, ReplayPlan, port_shortfall

    mesh = tuple((a, b) for a in range(4) for b in range(a + 1, 4))
    plan = ReplayPlan(programs={r: [] for r in range(4)}, scale=1.0, groups={
        "ring": CommGroup("ring", "dp", (0, 1, 2, 3)),
        "mesh": CommGroup("mesh", "ep", (0, 1, 2, 3), pairs=mesh)})
    ports = rail_job_ports(range(4), 1, 1)
    short = port_shortfall(plan, ports)
    assert short is not None
    assert (short.group.group_id, short.rank, short.peers, short.owned, short.needed_k) == (
        "ring", 0, (1, 3), 1, 3)
    with pytest.raises(PlanError, match="--ports-per-rank 3"):
        plan.job("check", ports)
    assert port_shortfall(plan, rail_job_ports(range(4), 1, 3)) is None
    plan.job("check", rail_job_ports(range(4), 1, 3))  # fits: no error
