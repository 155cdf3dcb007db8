"""``run.rank_cpu_quota`` on real Mininet/OVS: examples/tiny.yaml's 4 ranks in one cgroup with a
CPU quota, checked while they run (each rank's pid in the cgroup's ``cgroup.procs`` and its
``/proc/<pid>/cgroup``, the fabric's processes outside it) and after teardown (the cgroup gone,
its throttling counters in the summary)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from emulator.cpuquota import CGROUP_PREFIX, member_pids
from emulator.runstate import RunRecord, state_dir
from testbed.emulated.runner import run_emulated
from testbed.errors import RunRefused
from testbed.experiment.config import load_experiment
from testbed.experiment.prepare import prepare

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"
REPLAYER = "testbed.emulated.replayer"


def _placement(out: Path, timeout_s: float = 10.0) -> dict[str, object]:
    """While the run is live: the rank pids its record names, the cgroup's members once every
    rank is among them (polled: a rank writes its pid as it starts), and the cgroup each rank's
    ``/proc/<pid>/cgroup`` names."""
    manifest = json.loads((out / "manifest.json").read_text())
    cgroup = Path(manifest["rank_cgroup"])
    record = RunRecord.load(state_dir() / f"{manifest['prefix']}.json")
    ranks = [p.pid for p in record.processes if REPLAYER in p.marker]
    others = [p.pid for p in record.processes if REPLAYER not in p.marker]
    deadline = time.monotonic() + timeout_s
    members = member_pids(cgroup)
    while not set(ranks) <= set(members) and time.monotonic() < deadline:
        time.sleep(0.05)
        members = member_pids(cgroup)
    lines = {pid: Path(f"/proc/{pid}/cgroup").read_text() for pid in ranks}
    return {"cgroup": cgroup, "record_cgroups": record.cgroups, "ranks": ranks,
            "others": others, "members": members, "proc_cgroup": lines}


def test_ranks_run_inside_the_quota_cgroup_and_it_is_removed(tmp_path: Path,
                                                              no_leftovers: list[str]) -> None:
    cfg = load_experiment(TINY).replace(mode="baseline", rank_cpu_quota=0.9)
    out = tmp_path / "quota"
    seen: list[dict[str, object]] = []

    def say(message: str) -> None:
        if "iterations done: 0/" in message and not seen:  # the ranks have just started
            seen.append(_placement(out))

    try:
        summary = run_emulated(prepare(cfg), out, say=say)
    except RunRefused as exc:  # an optional feature: `opus-testbed check` says [off] then
        if "rank_cpu_quota" not in str(exc):
            raise
        pytest.skip(f"no usable cgroup cpu controller on this machine: {exc}")
    prefix = json.loads((out / "manifest.json").read_text())["prefix"]
    no_leftovers.append(prefix)  # also: no cgroup of the run is left
    assert seen, "the run never reported its first progress line"
    live = seen[0]
    cgroup = live["cgroup"]
    assert isinstance(cgroup, Path) and cgroup.name == f"{CGROUP_PREFIX}{prefix}"
    assert live["record_cgroups"] == [str(cgroup)]
    ranks = live["ranks"]
    assert isinstance(ranks, list) and len(ranks) == 4
    assert set(ranks) <= set(live["members"]), live  # type: ignore[arg-type]
    assert not set(live["others"]) & set(live["members"]), live  # type: ignore[arg-type]
    for pid, text in live["proc_cgroup"].items():  # type: ignore[attr-defined]
        assert f"/{cgroup.name}" in text, (pid, text)
    assert not cgroup.exists()
    assert summary["calls"] == summary["calls_delivered"] > 0
    quota = summary["rank_cpu_quota"]
    assert (quota["setting"], quota["fraction"], quota["cgroup"]) == (0.9, 0.9, cgroup.name)
    assert quota["nr_periods"] > 0 and quota["throttled_share"] is not None
    assert json.loads((out / "summary.json").read_text())["rank_cpu_quota"] == quota
