"""Kineto traces of PyTorch 2.0 with NCCL on GPUs (layout L2-GPU, no process-group metadata).

The traces are built by ``kineto_traces.trace_v20`` from the structure of PyTorch 2.0's
profiler output (its comment cites the public sources it was checked against): ``nccl:<op>``
annotations inside ``record_param_comms`` ops that carry no group name or ranks, NCCL kernels
linked by external id, ``gpu_user_annotation`` copies of the annotations on the GPU stream,
and a ``distributedInfo`` with only ``rank`` and ``world_size``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kineto_traces import fsdp_v20_calls, trace, trace_v20, write

from testbed.cli.main import main
from workloads.kineto import KinetoError, import_traces


def collectives(schedule: Any, rank: int) -> list[tuple[str, str, int]]:
    return [(o.axis, o.kind, o.size_bytes) for o in schedule.ops_of(rank) if o.is_collective]


def test_world_group_calls_import_without_group_metadata(tmp_path: Path) -> None:
    imp = import_traces(write(tmp_path, {r: trace_v20(r) for r in range(4)}))
    s = imp.schedule
    assert imp.layouts == {r: "L2-GPU" for r in range(4)} and imp.step == "ProfilerStep 5"
    assert imp.calls == {r: 4 for r in range(4)}  # the gpu_user_annotation copies are not calls
    assert s.groups["dp"].ranks.tolist() == [[0, 1, 2, 3]] and s.config.parallel.dp == 4
    assert "default_pg (torch's world group" in imp.notes[0]
    for rank in range(4):  # message = the input tensor: the shard, the full gradient
        assert collectives(s, rank) == [("dp", "all_gather", 4096), ("dp", "all_gather", 4096),
                                        ("dp", "reduce_scatter", 16384), ("dp", "all_reduce", 4)]
    compute = [o.duration_s for o in s.ops_of(0) if not o.is_collective]
    assert compute == pytest.approx([30e-6] * 4)  # the sgemm kernels, not the CPU gaps


def test_a_v20_trace_set_imports_and_runs_on_the_sim_backend(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = [str(p) for p in write(tmp_path / "traces", {r: trace_v20(r) for r in range(4)},
                                   gz=True)]
    assert main(["import", "kineto", *paths, "--out", str(tmp_path / "imp"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep["layouts"].values()) == {"L2-GPU"} and rep["groups"]["dp"] == 4
    code = main(["run", str(tmp_path / "imp" / "experiment.yaml"), "--backend", "sim",
                 "--json", "--out", str(tmp_path / "run")])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["all_iterations_completed"] is True
    assert summary["calls_delivered"] == summary["calls"] == 3 * 4 * 4  # warm-up + 2, 4 ranks


def refusal(tmp_path: Path, docs: dict[int, Any], **kw: Any) -> str:
    with pytest.raises(KinetoError) as err:
        import_traces(write(tmp_path, docs), **kw)
    return str(err.value)


def test_a_call_off_the_world_group_is_refused_naming_file_and_event(tmp_path: Path) -> None:
    """Ranks 0, 1 and ranks 2, 3 each all-reduce on a pair (sizes differ by pair): without
    process groups in the traces only the world group is known, and it cannot carry them."""
    docs = {r: trace_v20(r, calls=[*fsdp_v20_calls(r), ("all_reduce", 8 + 8 * (r // 2), 800.0)])
            for r in range(4)}
    msg = refusal(tmp_path, docs)
    assert "rank0.json: event 'nccl:all_reduce' at ts 805.0 (Ev Idx 9, External id" in msg
    assert "carry no process groups" in msg and "PyTorch before about 2.2" in msg


def test_a_send_on_a_subgroup_is_refused(tmp_path: Path) -> None:
    """Rank 2 is group rank 0 of its pair: ``send 0->1`` cannot be on the world group."""
    docs = {r: trace_v20(r) for r in range(4)}
    docs[2] = trace_v20(2, calls=[*fsdp_v20_calls(2), ("send 0->1", 16, 800.0)])
    msg = refusal(tmp_path, docs)
    assert "rank2.json: event 'nccl:send 0->1' at ts 805.0" in msg
    assert "no process group of rank 2 (default_pg [0, 1, 2, 3]) can carry this send" in msg


def test_point_to_point_on_the_world_group_is_a_pipeline_when_named(tmp_path: Path) -> None:
    docs = {0: trace_v20(0, world=2, calls=[("send 0->1", 2048, 300.0)]),
            1: trace_v20(1, world=2, calls=[("recv 1<-0", 2048, 300.0)])}
    s = import_traces(write(tmp_path, docs), axes={"default_pg": "pp"}).schedule
    assert s.groups["pp"].ranks.tolist() == [[0, 1]]
    assert collectives(s, 0) == [("pp", "send", 8192)] and collectives(s, 1) == [
        ("pp", "recv", 8192)]
    assert next(o for o in s.ops_of(1) if o.kind == "recv").peer == 0


def test_without_record_shapes_the_size_is_missing_and_refused(tmp_path: Path) -> None:
    docs = {r: trace_v20(r) for r in range(4)}
    for e in docs[3]["traceEvents"]:
        e.get("args", {}).pop("Input Dims", None)
    msg = refusal(tmp_path, docs)
    assert "rank3.json: event 'nccl:_all_gather_base' at ts 105.0" in msg
    assert "record_shapes=True" in msg


def test_the_older_in_msg_size_argument_counts_elements(tmp_path: Path) -> None:
    """About torch 2.1 ``record_param_comms`` said ``In msg size`` for what is now ``In msg
    nelems`` (both are the tensor's numel): the same traces give the same sizes."""
    docs = {r: trace(r, "L1") for r in range(4)}
    for doc in docs.values():
        for e in doc["traceEvents"]:
            if e["name"] == "record_param_comms":
                e["args"]["In msg size"] = e["args"].pop("In msg nelems")
    s = import_traces(write(tmp_path, docs)).schedule
    assert collectives(s, 0) == [("fsdp", "all_gather", 4096), ("pp", "send", 8192),
                                 ("fsdp", "reduce_scatter", 8192)]
