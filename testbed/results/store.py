"""The results directory of a run: manifest, tables, summary, plots; and ``report``.

Layout of ``DIR``::

    manifest.json            config, package versions, git revision, machine facts
    summary.json             the figures (:mod:`testbed.metrics.compute`), the fidelity verdict
    controller-events.jsonl  the Opus event log
    ranks/rank*.jsonl        what each rank recorded
    iterations.csv calls.csv compute.csv windows.csv (gaps.csv) circuits.csv rails.csv
    timeline.png windows_cdf.png

A sweep directory has ``sweep.csv``, ``sweep.json``, ``iteration_vs_delay.png`` and one run
directory per point; ``run --baseline``'s folder holds two runs, ``baseline/`` and ``MODE/``
(:mod:`testbed.results.folders`).
"""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from testbed.errors import RunError
from testbed.results import plots
from testbed.results.folders import SWEEP, classify, not_a_results_folder

PACKAGES = ("opus-testbed", "os-ken", "pyzmq", "numpy", "matplotlib", "psutil", "PyYAML",
            "ncclient", "asyncssh")
REPO = Path(__file__).resolve().parents[2]


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


class RecordFileError(RunError):
    """A JSON-lines file with a bad line that is not a cut-off last line."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (``[]`` if it does not exist), one per non-blank line.

    Only a cut-off last line is skipped: an unparsable final line without its newline, as a
    writer killed mid-line leaves it. Any other unparsable line means the file is corrupt, and
    the records around it cannot be trusted: :class:`RecordFileError` names the file and line.
    """
    if not path.exists():
        return []
    return parse_jsonl_lines(path, path.read_text(encoding="utf-8").split("\n"))


def parse_jsonl_lines(path: Path, lines: list[str]) -> list[dict[str, Any]]:
    """The records of ``path``'s ``lines`` (its text split at newlines: the last item is ""
    when the file ends with one; blank lines are skipped), as :func:`read_jsonl` reads them.
    A good file is parsed in one call of the JSON decoder; on a bad line, line by line."""
    kept = [line for line in lines if line.strip()]
    try:
        return list(json.loads("[" + ",".join(kept) + "]"))
    except ValueError:
        pass
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError as exc:
            if number == len(lines):  # no newline after it: the writer stopped mid-line
                break
            raise RecordFileError(
                f"{path}:{number}: not a JSON record ({exc}); only a cut-off last line (a "
                "writer killed mid-line) is skipped, so this file is corrupt") from exc
    return out


def git_revision() -> dict[str, Any]:
    def git(*args: str) -> str:
        res = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                             check=False, timeout=10)
        return res.stdout.strip() if res.returncode == 0 else ""

    rev = git("rev-parse", "HEAD")
    return {"revision": rev or None, "dirty": bool(git("status", "--porcelain")) if rev else None}


def machine_facts() -> dict[str, Any]:
    ovs = subprocess.run(["ovs-vsctl", "--version"], capture_output=True, text=True,
                         check=False).stdout.splitlines()
    return {"hostname": platform.node(), "kernel": platform.release(),
            "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "memory_mb": round(psutil.virtual_memory().total / 2**20),
            "load_average": os.getloadavg(), "ovs": ovs[0] if ovs else None}


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def start_manifest(out: Path, backend: str, config: dict[str, Any], **facts: Any
                   ) -> dict[str, Any]:
    """Write ``manifest.json`` as a run starts (status "running"); returns it for updating."""
    manifest = {"status": "running", "backend": backend, "config": config, **facts,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "packages": package_versions(), "git": git_revision(),
                "machine": machine_facts(), "command": sys.argv}
    write_json(out / "manifest.json", manifest)
    return manifest


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def render_run(run_dir: Path, title: str = "") -> list[Path]:
    """Draw a run's plots from its CSV files; returns the files written."""
    summary = json.loads((run_dir / "summary.json").read_text()) if (
        run_dir / "summary.json").exists() else {}
    title = title or str(summary.get("name", run_dir.name))
    calls = read_csv(run_dir / "calls.csv")
    compute = read_csv(run_dir / "compute.csv")
    circuits = read_csv(run_dir / "circuits.csv")
    iterations = read_csv(run_dir / "iterations.csv")
    windows = read_csv(run_dir / "windows.csv")
    written = []
    measured = [r for r in iterations if r.get("measured") == "True"] or iterations
    if measured:
        ranks = [int(r) for r in summary.get("timeline_ranks", [])] or sorted(
            {int(c["rank"]) for c in calls})[:8]
        rails = [int(r) for r in summary.get("timeline_rails", [0])]
        path = run_dir / "timeline.png"
        plots.timeline(calls, compute, circuits, measured[-1], ranks, rails, path,
                       f"{title}: collectives per rank and circuits per rail")
        written.append(path)
    failovers = read_csv(run_dir / "failovers.csv")
    for i, row in enumerate(failovers):
        ranks = sorted({int(r) for r in summary.get("timeline_ranks", [])} | {int(row["rank"])})
        path = run_dir / f"failover{i}.png"
        plots.failover_timeline(calls, compute, circuits, row, ranks[:9], path,
                                f"{title}: recovery {i} (rank {row['rank']}, {row['policy']})")
        written.append(path)
    if (run_dir / "windows.csv").exists():  # a switched run has them from its baseline only
        path = run_dir / "windows_cdf.png"
        baseline = summary.get("mode") == "baseline"
        plots.window_cdf(windows, path, f"{title}: windows " + (
            "between phases (paper §3.1)" if baseline
            else "of the electrical baseline (paper §3.1)"),
            delay_ms=None if baseline else summary.get("switching_delay_ms"))
        written.append(path)
    return written


def render_sweep(sweep_dir: Path) -> list[Path]:
    rows = read_csv(sweep_dir / "sweep.csv")
    meta = json.loads((sweep_dir / "sweep.json").read_text()) if (
        sweep_dir / "sweep.json").exists() else {}
    path = sweep_dir / "iteration_vs_delay.png"
    title = plots.sweep_title(
        str(meta.get("name", sweep_dir.name)), str(meta.get("backend", "?")),
        meta.get("semantics") or sorted({str(r.get("semantics")) for r in rows
                                         if r.get("semantics")}),
        (meta.get("modes") if meta.get("planes", ["opus"]) == ["opus"] else None)  # issue 40
        or list(dict.fromkeys(str(r["mode"]) for r in rows)),
        meta.get("delays_ms") or sorted({float(r["delay_ms"]) for r in rows}))
    plots.sweep_plot(rows, path, title, families=meta.get("families", ()),
                     reference=meta.get("reference"))
    return [path]


def report(path: Path) -> list[Path]:
    """Redraw the plots of a run, a sweep (and its runs), or ``run --baseline``'s folder (both
    its runs); :class:`FileNotFoundError` naming the folders inside otherwise."""
    folder = classify(path)
    if folder is None:
        raise FileNotFoundError(not_a_results_folder(path))
    written = render_sweep(path) if folder.kind == SWEEP else []
    for run_dir in folder.runs:
        written += render_run(run_dir)
    return written
