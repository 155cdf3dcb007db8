"""The execution-trace importer (workloads.exec_trace) on traces this project records.

Real: ``data/et-mesh2x2`` (torch 2.13 CPU/gloo, layout ET-c10d, recorded by ``et_job.py``; its
README says how) and, when torch is installed, a fresh recording of the same job. Synthetic:
the ET-named layout (``record_param_comms`` nodes with the attributes torch 2.13's observer
writes for NCCL; no GPU here) and the refusals.
"""

from __future__ import annotations

import copy
import gzip
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from et_job import calls

from testbed.check import ci_requested
from testbed.cli.main import main
from workloads.exec_trace import ExecTraceError, import_ets

DATA = Path(__file__).parent / "data" / "et-mesh2x2"
PATHS = [DATA / f"rank{r}.json.gz" for r in range(4)]
JOB = Path(__file__).parent / "et_job.py"
AXIS = {"world": "dp", "pp": "pp", "fsdp": "fsdp"}  # with --axis default_pg=dp


def expected(rank: int) -> list[tuple[str, str, int, int]]:
    """(axis, kind, bytes, peer) of what et_job did on ``rank``."""
    peer = {"send": rank + 2, "recv": rank - 2}
    return [(AXIS[g], k, 4 * n, peer.get(k, -1)) for k, g, n in calls(rank)]


def imported_calls(s: Any, rank: int) -> list[tuple[str, str, int, int]]:
    return [(o.axis, o.kind, o.size_bytes, o.peer) for o in s.ops_of(rank) if o.is_collective]


def check(paths: list[Path]) -> None:
    imp = import_ets(paths, axes={"default_pg": "dp"})
    s = imp.schedule
    assert imp.layouts == {r: "ET-c10d" for r in range(4)} and imp.step == "whole trace"
    assert s.groups["pp"].ranks.tolist() == [[0, 2], [1, 3]]
    assert s.groups["fsdp"].ranks.tolist() == [[0, 1], [2, 3]]
    assert s.groups["dp"].ranks.tolist() == [[0, 1, 2, 3]]
    for rank in range(4):
        assert imported_calls(s, rank) == expected(rank)
        ops = s.ops_of(rank)  # no compute; every call is blocking: each waits for the last
        assert all(o.is_collective for o in ops)
        assert all(o.deps and max(o.deps) == o.index - 1 for o in ops[1:])
    assert s.origin is not None and s.origin["kind"] == "execution-trace"


def test_recorded_traces_give_the_jobs_calls_groups_and_order() -> None:
    check(PATHS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_fresh_recording_imports_to_what_the_job_did(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is None:
        if ci_requested():  # the project declares torch (scripts/setup.sh installs it)
            pytest.fail(f"CI=true but torch is not installed for {sys.executable}")
        pytest.skip(f"torch is not installed for {sys.executable}")
    env = {**os.environ, "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", str(JOB), str(tmp_path)],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for r in range(4)]
    deadline = time.monotonic() + 180.0
    try:
        outs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
                for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [o.decode()[-1000:] for o in outs]
    check([tmp_path / f"rank{r}.json" for r in range(4)])


def test_import_et_and_a_sim_run_from_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "imp"
    assert main(["import", "et", *map(str, PATHS), "--out", str(out), "--axis",
                 "default_pg=dp", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["calls"] == {str(r): 6 for r in range(4)}
    assert any("no compute" in n for n in rep["notes"])
    assert "import et" in (out / "experiment.yaml").read_text()
    code = main(["run", str(out / "experiment.yaml"), "--backend", "sim", "--json",
                 "--out", str(tmp_path / "run")])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["all_iterations_completed"] is True
    assert summary["calls_delivered"] == summary["calls"] == 3 * 4 * 6


def docs() -> dict[int, dict[str, Any]]:
    out = {}
    for r, p in enumerate(PATHS):
        with gzip.open(p, "rt") as fh:
            out[r] = json.load(fh)
    return out


def write(dir_: Path, ds: dict[int, dict[str, Any]]) -> list[Path]:
    dir_.mkdir(parents=True, exist_ok=True)
    paths = []
    for r, d in ds.items():
        p = dir_ / f"rank{r}.json"
        p.write_text(json.dumps(d))
        paths.append(p)
    return paths


def c10d_nodes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted((n for n in doc["nodes"] if n["name"].startswith("c10d::")),
                  key=lambda n: n["id"])


def refusal(paths: list[Path], **kw: Any) -> str:
    with pytest.raises(ExecTraceError) as err:
        import_ets(paths, **kw)
    return str(err.value)


def test_calls_only_timing_could_place_are_refused_naming_file_and_node(tmp_path: Path) -> None:
    """Equal FSDP all-reduce sizes on both stages: the first call fits the FSDP pair and the
    pipeline pair alike, and an ET has no times or threads to tell them apart."""
    ds = docs()
    for d in ds.values():
        first = c10d_nodes(d)[0]  # c10d::allreduce_ of 64 + 32 x stage floats
        first["inputs"]["values"][0][0][3] = 64
    msg = refusal(write(tmp_path, ds), axes={"default_pg": "dp"})
    assert "rank0.json: node 'c10d::allreduce_' (id 9, rf_id 5)" in msg
    assert "alike" in msg


def test_unnamed_groups_need_an_axis(tmp_path: Path) -> None:
    msg = refusal(PATHS)
    assert "group default_pg [0, 1, 2, 3] has no schedule axis" in msg
    assert "--axis default_pg=AXIS" in msg


@pytest.mark.parametrize(("change", "words"), [
    (lambda d: d[2].update(nodes=[n for n in d[2]["nodes"]
                                  if n["name"] != "## process_group:init ##"]),
     ["rank2.json: no '## process_group:init ##' node"]),
    (lambda d: d.pop(3), ["3 traces of a 4-rank job: ranks [3] are missing"]),
    (lambda d: d[1].pop("nodes"), ["rank1.json: not a PyTorch execution trace"]),
    (lambda d: [n.update(name="c10d::broadcast_") for n in c10d_nodes(d[0])[:1]],
     ["rank0.json: node 'c10d::broadcast_'", "'broadcast' cannot be mapped"]),
])
def test_bad_trace_sets_are_refused_naming_the_file(tmp_path: Path, change: Any,
                                                    words: list[str]) -> None:
    ds = docs()
    change(ds)
    msg = refusal(write(tmp_path, ds), axes={"default_pg": "dp"})
    for word in words:
        assert word in msg


def test_the_rank_comes_from_the_file_name_and_must_fit_the_groups(tmp_path: Path) -> None:
    ds = docs()
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "rank.json").write_text(json.dumps(ds[0]))
    msg = refusal([tmp_path / "first" / "rank.json"])
    assert "rank.json: an execution trace does not say its rank" in msg
    assert "rank<R>.json" in msg
    msg = refusal(write(tmp_path / "swapped", {0: ds[2], 1: ds[1], 2: ds[0], 3: ds[3]}))
    assert "rank0.json: the file name says rank 0, but the trace's group mesh_pp [0, 2]" \
           not in msg  # rank 0 is in that one; its FSDP pair tells
    assert "rank0.json: the file name says rank 0, but the trace's group mesh_fsdp [2, 3] " \
           "does not hold it" in msg


def named_docs() -> dict[int, dict[str, Any]]:
    """ET-named: the recorded traces with each c10d node's call restated as the
    ``record_param_comms`` child NCCL would record (attributes as torch 2.13's observer
    names them), groups named."""
    ds = docs()
    for r, d in ds.items():
        init = next(n for n in d["nodes"] if n["name"] == "## process_group:init ##")
        pgs = {g["pg_desc"]: g for g in json.loads(init["inputs"]["values"][0])}
        for (kind, group, n), node in zip(calls(r), c10d_nodes(d), strict=True):
            desc = {"world": "default_pg", "pp": "mesh_pp", "fsdp": "mesh_fsdp"}[group]
            pg = pgs[desc]
            ranks = pg["ranks"] or [0, 1, 2, 3]
            rpc = copy.deepcopy(node)
            rpc.update(id=node["id"] + 100000, name="record_param_comms", ctrl_deps=node["id"])
            peer = ranks.index(r + 2 if kind == "send" else r - 2) if kind in ("send", "recv") \
                else ranks.index(r)
            rpc["inputs"] = {"values": [[], 1, [pg["pg_name"], desc], peer, kind, [], []],
                             "shapes": [], "types": [], "strides": []}
            rpc["attrs"] = [*node["attrs"], *({"name": k, "type": t, "value": v} for k, t, v in (
                ("collective_name", "string", kind), ("dtype", "string", "Float"),
                ("in_msg_nelems", "uint64", n), ("out_msg_nelems", "uint64", n),
                ("pg_name", "string", pg["pg_name"]), ("pg_desc", "string", desc),
                ("pg_size", "uint64", len(ranks)), ("global_rank_start", "uint64", ranks[0]),
                ("global_rank_stride", "uint64", ranks[1] - ranks[0])))]
            d["nodes"].append(rpc)
    return ds


def test_named_record_param_comms_nodes_give_their_groups(tmp_path: Path) -> None:
    ds = named_docs()
    for d in ds.values():  # equal sizes everywhere: only the names can tell the groups now
        for node in d["nodes"]:
            if node["name"] == "record_param_comms":
                for a in node["attrs"]:
                    if a["name"] == "in_msg_nelems":
                        a["value"] = 64
    imp = import_ets(write(tmp_path, ds), axes={"default_pg": "dp"})
    assert imp.layouts == {r: "ET-named" for r in range(4)}
    for rank in range(4):
        assert imported_calls(imp.schedule, rank) == [
            (a, k, 256, p) for a, k, _, p in expected(rank)]
