"""The opus backend with real torch on loopback (no root): every call carried and recorded,
a failing script named with its rank and log, and a missing torch refused with the fix."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from testbed.check import ci_requested
from testbed.cli.main import main
from testbed.errors import RankFailed
from testbed.torchjob.config import TorchExperiment, parse_torch_experiment
from testbed.torchjob.runner import TorchPrepared, run_loopback, run_torch

if importlib.util.find_spec("torch") is None and not ci_requested():
    pytest.skip("torch is not installed (bash scripts/setup.sh installs it)",
                allow_module_level=True)

HERE = Path(__file__).resolve().parent
OPS_PER_RANK = (["allreduce"] * 5 + ["all_gather_single", "allgather", "reduce_scatter_single",
                                     "reduce_scatter", "broadcast", "send", "recv"])


def _experiment(script: Path, servers: int) -> TorchExperiment:
    return parse_torch_experiment(
        f"cluster: {{servers: {servers}, gpus_per_server: 1}}\n"
        f"workload: {{torch: {{script: {script}}}}}\nrun: {{warmup: 1, iterations: 1}}\n",
        "test.yaml")


def _processes_running(text: str) -> list[int]:
    """Live processes whose command line mentions ``text``."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if text in (proc / "cmdline").read_bytes().decode(errors="replace") and \
                    (proc / "stat").read_text().split()[2] != "Z":
                out.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return out


@pytest.fixture(scope="module")
def ops_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, list[dict]]]:
    out = tmp_path_factory.mktemp("ops") / "run"
    prep = TorchPrepared(_experiment(HERE / "torch_ops_job.py", 3), link_mbps=100.0)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OPS_TRACE_DIR", str(out.parent))
        return out, run_loopback(prep, out, say=lambda _m: None)


def test_every_call_is_carried_with_exact_results(ops_run: tuple[Path, Any]) -> None:
    out, _ = ops_run
    for rank in range(3):
        log = (out / "ranks" / f"rank{rank}.log").read_text().splitlines()
        lines = [json.loads(x) for x in log if x.startswith("{")]
        assert {"rank": rank, "checks": 13 if rank != 1 else 12} in lines, log
        assert {"refused": "opus backend: reduce on group default_pg (members [0, 1, 2]) is not "
                "carried (all-gather, reduce-scatter, all-reduce, send/recv, broadcast and "
                "barrier are)"} in lines


def test_each_call_is_one_intent_ack_and_completion_on_its_lane(ops_run: tuple[Path, Any]
                                                                ) -> None:
    _, records = ops_run
    for rank, recs in records.items():
        calls = sorted((r for r in recs if r["ev"] == "call"), key=lambda r: r["i"])
        pair = ["allreduce"] if rank != 1 else []
        assert [c["op"] for c in calls] == OPS_PER_RANK + pair + ["barrier", "allreduce"]
        per_lane = Counter()
        for c in calls:  # numbered per lane in issue order, as the Opus shim numbers them
            assert c["seq"] == per_lane[c["lane"]] and c["cid"] == f"{c['lane']}:{c['seq']}"
            per_lane[c["lane"]] += 1
            assert c["t_issue"] <= c["t_intent"] <= c["t_ack"] <= c["t_end"]
            assert c["received"] == c["expected"] and c["sent"] == c["wire_bytes"]
            assert c["t_wait_start"] is not None  # the script waited for every call
        assert calls[0]["lane"] == "world0-1-2" and calls[0]["size_bytes"] == 80
        # 10 float64 in chunks of 32, 24, 24 bytes: position i sends all but chunks i and i+1,
        # twice the data in all (reduce-scatter, then all-gather)
        assert calls[0]["wire_bytes"] == [104, 112, 104][rank]
        sends = [c for c in calls if c["op"] in ("send", "recv")]
        assert {c["lane"] for c in sends} == {f"p2p{min(rank, p)}-{max(rank, p)}"
                                              for p in ((rank + 1) % 3, (rank - 1) % 3)}
        assert [r["it"] for r in recs if r["ev"] == "iteration"] == [0, 1]
        assert recs[-1]["ev"] == "finished"


def test_profiler_traces_name_each_call_as_nccl_does(ops_run: tuple[Path, Any]) -> None:
    """`import kineto` reads the backend's opus:<method> events (layout L4)."""
    from workloads.kineto import detect_layout, load_trace

    out, _ = ops_run
    trace = load_trace(out.parent / "rank1.json")
    assert detect_layout(trace) == "L4"
    (event,) = [e for e in trace.events if e.get("name") == "opus:allreduce"]
    assert {k: event["args"][k] for k in ("Collective name", "In msg nelems", "dtype",
                                          "Group size", "Process Group Ranks")} == {
        "Collective name": "allreduce", "In msg nelems": 10, "dtype": "float64",
        "Group size": 3, "Process Group Ranks": "[0, 1, 2]"}


def test_a_failing_script_names_the_rank_its_error_and_log(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import os\nimport torch.distributed as dist\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    raise ValueError('bad batch on rank 1')\n"
                      "dist.init_process_group('gloo')\n"
                      "dist.all_reduce(__import__('torch').ones(1))\n")
    out = tmp_path / "run"
    with pytest.raises(RankFailed) as info:
        run_torch(_experiment(script, 3).replace(mode="baseline"), out,
                  say=lambda _m: None)
    assert info.value.rank == 1
    message = str(info.value)
    assert "rank 1 failed" in message and "ValueError: bad batch on rank 1" in message
    assert f"log: {out / 'reference' / 'ranks' / 'rank1.log'}" in message
    assert not _processes_running(str(out))  # every rank's launcher was stopped


def test_a_missing_torch_gives_the_install_command(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else find_spec(name, *a))
    out = tmp_path / "run"
    config = HERE.parents[1] / "examples" / "torch" / "llama-tiny-4x1.yaml"
    assert main(["run", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "torch is not installed" in err and "pip install 'opus-testbed[torch]'" in err
    assert not out.exists()  # nothing was created


def test_every_group_method_torch_calls_is_carried_or_refused() -> None:
    """torch 2.13's Python layer calls these names on a group object; a name added by another
    torch release shows up here instead of as an AttributeError inside a job. (Read as source,
    so that this process need not import torch.)"""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations
    torch_dir = Path(next(iter(spec.submodule_search_locations)))
    c10d = torch_dir / "distributed" / "distributed_c10d.py"
    called = set(re.findall(r"\bgroup\.([a-z_]+)\(", c10d.read_text()))
    backend = ast.parse((HERE.parents[1] / "testbed" / "torchjob" / "backend.py").read_text())
    (cls,) = [n for n in backend.body if isinstance(n, ast.ClassDef)
              and n.name == "OpusProcessGroup"]
    carried = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    (loop,) = [n for n in backend.body if isinstance(n, ast.For)]
    refused = {c.value for c in ast.walk(loop.iter) if isinstance(c, ast.Constant)}
    bookkeeping = {"rank", "size", "_get_backend", "_start_coalescing", "_end_coalescing"}
    assert {"allreduce", "send", "reduce"} <= called
    for name in sorted(called - bookkeeping):
        assert name in carried | refused, f"group.{name}() is neither carried nor refused"


SCALE_UP_JOB = """import time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)  # the two GPUs of the server meet over the scale-up sockets
print("reduced", t.tolist(), flush=True)
time.sleep(600)
"""


def test_a_killed_runs_scale_up_sockets_are_in_its_dir_and_removed_by_clean(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One server with 2 GPUs on loopback: the scale-up sockets work from the run's own folder
    (a path too long for a socket address, reached through /proc/self/fd), not one in /tmp,
    and after SIGKILL of the run the recorded folder is what ``clean`` removes."""
    from emulator import runstate

    state = tmp_path / "state"
    monkeypatch.setenv("OPUS_STATE_DIR", str(state))
    script = tmp_path / "scale_up_job.py"
    script.write_text(SCALE_UP_JOB)
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"cluster: {{servers: 1, gpus_per_server: 2}}\n"
                   f"workload: {{torch: {{script: {script}}}}}\nmode: baseline\n")
    out = tmp_path / ("a-results-folder-with-a-long-name-" * 3) / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from testbed.cli.main import main; "
         "sys.exit(main(sys.argv[1:]))", "run", str(exp), "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(HERE.parents[1])},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sockets = out.resolve() / "reference" / "scaleup"
    logs = [out / "reference" / "ranks" / f"rank{r}.log" for r in range(2)]
    try:
        deadline = time.monotonic() + 240
        while not all(p.exists() and "reduced [2.0" in p.read_text() for p in logs):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, [p.read_text()[-500:] for p in logs
                                                 if p.exists()]
            time.sleep(0.2)
        assert len(str(sockets / "r0.sock")) > 107  # too long to bind directly
        assert sorted(p.name for p in sockets.glob("r*.sock")) == ["r0.sock", "r1.sock"]
        os.kill(proc.pid, signal.SIGKILL)  # no teardown: a crash
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    wait_until = time.monotonic() + 30  # the ranks follow their parent (PDEATHSIG)
    while _processes_running(str(out)) and time.monotonic() < wait_until:
        time.sleep(0.1)
    assert not _processes_running(str(out))
    plan = json.loads((out / "reference" / "ranks" / "rank1.plan.json").read_text())
    assert plan["scale_up_dir"] == str(sockets)  # not a folder in /tmp
    assert plan["listen"][1] == str(sockets / "r1.sock")
    assert plan["peers"]["0"] == str(sockets / "r0.sock")
    assert sockets.is_dir(), "the killed run's scale-up folder should be left to clean"
    assert runstate.clean_dirs() == [str(sockets)]
    assert not sockets.exists() and (out / "reference" / "ranks").is_dir()  # results stay
