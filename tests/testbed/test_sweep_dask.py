"""The Dask engine of simulated sweeps gives the same points as the process engine.

Needs the ``dask`` extra (``pip install 'opus-testbed[dask]'``, installed by scripts/setup.sh);
skipped without it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from testbed.experiment.config import load_experiment
from testbed.studies.sweep import run_sweep

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"
# Fields of a point that are not results: its wall clock time and where it is.
RUN_FIELDS = {"wall_s", "run_dir"}
NOT_COMPARED = {"manifest.json", "summary.json"}  # compared below without their run fields


def _children() -> set[int]:
    """Our live child processes, less multiprocessing's resource tracker (it lives as long as
    this process once anything has used it)."""
    kids = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not any(
                    "resource_tracker" in a for a in p.cmdline()):
                kids.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return kids


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _results(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in RUN_FIELDS}


def test_dask_engine_matches_process_engine(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("dask.distributed")
    import dask

    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)  # a LocalCluster, not a remote one
    cfg = load_experiment(TINY)
    before = _children()
    rows = {}
    with dask.config.set({"temporary-directory": str(tmp_path / "dask-tmp")}):
        for engine in ("process", "dask"):
            rows[engine] = run_sweep(cfg, [0, 10, 50], ["on-demand"], tmp_path / engine, "sim",
                                     2, lambda _m: None, engine=engine)

    # Same points in the same order, each with the same results.
    assert [(r["mode"], r["delay_ms"]) for r in rows["dask"]] == [
        ("baseline", 0.0), ("on-demand", 10.0), ("on-demand", 50.0)]
    assert all(not r["error"] and r["iteration_time_s"] for r in rows["dask"])
    assert [_results(r) for r in rows["dask"]] == [_results(r) for r in rows["process"]]
    for engine in rows:
        assert [r["run_dir"] for r in rows[engine]] == [
            str(tmp_path / engine / p) for p in ("baseline", "on-demand-10ms", "on-demand-50ms")]

    # Same results directories: same files, byte for byte but for the run's own fields (the
    # dask scratch directory sits beside the two sweeps, not in them).
    proc, dsk = _files(tmp_path / "process"), _files(tmp_path / "dask")
    assert sorted(dsk) == sorted(proc)
    assert {"sweep.csv", "sweep.json", "iteration_vs_delay.png"} <= set(dsk)
    for point in ("baseline", "on-demand-10ms", "on-demand-50ms"):
        assert f"{point}/summary.json" in dsk and f"{point}/ranks/rank0.jsonl" in dsk
    for name in sorted(dsk):
        if Path(name).name in NOT_COMPARED | {"sweep.json", "sweep.csv"}:
            continue
        assert dsk[name] == proc[name], name
    for point in ("baseline", "on-demand-10ms", "on-demand-50ms"):
        s_proc, s_dask = (json.loads(f[f"{point}/summary.json"]) for f in (proc, dsk))
        assert _results(s_dask) == _results(s_proc)
        m_proc, m_dask = (json.loads(f[f"{point}/manifest.json"]) for f in (proc, dsk))
        when = {"started", "finished", "machine"}  # clock times and the machine's load
        assert {k: v for k, v in m_dask.items() if k not in when} == {
            k: v for k, v in m_proc.items() if k not in when}
    sweeps = {e: json.loads((tmp_path / e / "sweep.json").read_text()) for e in rows}
    assert sweeps["dask"]["engine"] == "dask" and sweeps["process"]["engine"] == "process"
    assert [_results(p) for p in sweeps["dask"]["points"]] == [
        _results(p) for p in sweeps["process"]["points"]]

    # The LocalCluster (scheduler, nannies, workers) is gone with the sweep.
    deadline = time.monotonic() + 10
    while _children() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _children() - before, "processes left over after the dask sweep"
