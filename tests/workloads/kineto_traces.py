"""Synthetic torch.profiler traces for the Kineto importer's tests (imported by pytest).

Layouts L1, L1-GPU, L2 and L4 are not produced on this machine (no GPU, no NCCL; torch 2.13
on CPU writes L3), so these traces are built from the documented key names: PyTorch's
``record_param_comms`` metadata (``Collective name``, ``In msg nelems``, ``dtype``, ``Group
size``, ``Process Group Name``/``Description``/``Ranks``, ``Rank`` = the p2p peer's group rank,
``In split size``), NCCL kernels carrying copies of them, ``nccl:<op>`` annotations inside
``record_param_comms`` with ``Input Dims``/``Input type``, and the project's ``opus:<kind>``.

The job: FSDP 2 x PP 2 on 4 ranks (pp groups [0, 2], [1, 3]; fsdp groups [0, 1], [2, 3]).
Each rank, within ``ProfilerStep#3`` (0 to 1000 µs): an all-gather of 1024 floats on its FSDP
group at 100 µs, stage 0 sends 2048 floats to stage 1 at 300 µs, a reduce-scatter of 2048
floats at 500 µs (stage 1's collectives 30 µs later and 32/64 floats larger than stage 0's, as
the real job's stages hold different parameters: without group names, L2 needs the sizes to
tell the FSDP pair from the pipeline pair); ``aten::mm`` compute in between.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

GROUPS = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("mesh_pp", None), "3": ("mesh_fsdp", None)}
MAIN = 1  # main thread id
COMPUTE_US = [(10, 90), (150, 290), (350, 490), (550, 990)]


def members(rank: int, name: str) -> list[int]:
    if name == "0":
        return [0, 1, 2, 3]
    if name == "1":
        return [rank % 2, rank % 2 + 2]
    return [rank - rank % 2, rank - rank % 2 + 1]


def pg_config(rank: int) -> list[dict[str, Any]]:
    return [{"pg_name": n, "pg_desc": d, "backend_config": "cuda:nccl",
             "pg_size": len(members(rank, n)), "ranks": members(rank, n)}
            for n, (d, _) in GROUPS.items()]


def job_calls(rank: int) -> list[tuple[str, str, int, float, int]]:
    """(collective name, group name, elements, ts µs, peer's group rank or -1)."""
    stage = rank // 2
    p2p = ("send", "1", 2048, 300.0, 1) if stage == 0 else ("recv", "1", 2048, 300.0, 0)
    return [("_allgather_base", "3", 1024 + 32 * stage, 100.0 + 30 * stage, -1), p2p,
            ("_reduce_scatter_base", "3", 2048 + 64 * stage, 500.0 + 30 * stage, -1)]


def named_args(rank: int, coll: str, group: str, nelems: int, peer: int) -> dict[str, Any]:
    out_n = {"_allgather_base": 2 * nelems, "_reduce_scatter_base": nelems // 2}.get(coll,
                                                                                   nelems)
    args: dict[str, Any] = {
        "Collective name": coll, "dtype": "Float", "In msg nelems": nelems,
        "Out msg nelems": out_n, "Group size": 2, "In split size": "[]",
        "Out split size": "[]", "Process Group Name": group,
        "Process Group Description": GROUPS[group][0],
        "Process Group Ranks": str(members(rank, group))}
    if peer >= 0:
        args["Rank"] = peer
        args["Dst Rank" if coll == "send" else "Src Rank"] = members(rank, group)[peer]
    return args


def trace(rank: int, layout: str, *, gpu: bool = False, step: int = 3,
          calls: list[tuple[str, str, int, float, int]] | None = None) -> dict[str, Any]:
    """One rank's trace in ``layout`` (L1, L2, L4)."""
    ev: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 7,
         "tid": MAIN, "ts": 0.0, "dur": 1000.0, "args": {}}]
    for i, (a, b) in enumerate(COMPUTE_US):
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": MAIN,
                   "ts": float(a), "dur": float(b - a), "args": {"External id": 900 + i}})
    for k, (coll, group, n, ts, peer) in enumerate(calls or job_calls(rank)):
        base = {"ph": "X", "pid": 7, "tid": MAIN, "ts": ts, "dur": 20.0}
        if layout in ("L1", "L4"):
            name = "record_param_comms" if layout == "L1" else f"opus:{coll}"
            ev.append({**base, "cat": "cpu_op", "name": name,
                       "args": {**named_args(rank, coll, group, n, peer), "Ev Idx": k}})
        else:  # L2: nccl:<op> inside record_param_comms, sizes as Input Dims
            ev.append({**base, "cat": "cpu_op", "name": "record_param_comms",
                       "args": {"Input Dims": [[n]], "Input type": ["float"], "Ev Idx": k}})
            label = coll.removeprefix("_").removesuffix("_base").replace("allgather",
                                                                          "all_gather")
            if peer >= 0:
                me = members(rank, group).index(rank)
                label += f" {me}->{peer}" if coll == "send" else f" {me}<-{peer}"
            ev.append({**base, "cat": "user_annotation", "name": f"nccl:{label}", "ts": ts + 1,
                       "dur": 10.0, "args": {}})
        if gpu:
            ev.append({"ph": "X", "cat": "kernel", "name": f"ncclDevKernel_{coll}", "pid": 0,
                       "tid": 7, "ts": ts + 30, "dur": 40.0,
                       "args": {"Process Group Name": group, "correlation": 500 + k}})
    if gpu:  # one compute kernel per compute span, launched at its start, running 30 µs
        for i, (a, _) in enumerate(COMPUTE_US):
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7,
                       "tid": MAIN, "ts": a + 1.0, "dur": 2.0, "args": {"correlation": i}})
            ev.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64", "pid": 0,
                       "tid": 8, "ts": a + 5.0, "dur": 30.0, "args": {"correlation": i}})
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 4,
                                "pg_count": 3, "pg_config": pg_config(rank)}}


def write(dir_: Path, docs: dict[int, dict[str, Any]], gz: bool = False) -> list[Path]:
    """Write each rank's document as ``rank<r>.json`` (or ``.json.gz``); the paths."""
    dir_.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, doc in docs.items():
        p = dir_ / f"rank{rank}.json{'.gz' if gz else ''}"
        with (gzip.open(p, "wt") if gz else open(p, "w")) as fh:
            fh.write(json.dumps(doc))  # dumps: the C encoder, json.dump streams in Python
        paths.append(p)
    return paths


# --- PyTorch 2.0 with NCCL on GPUs (layout L2-GPU, no process-group metadata) ---------------
#
# The structure below follows what PyTorch 2.0's ProcessGroupNCCL and Kineto write, checked
# against public sources (no trace file of theirs is copied here):
# * torch/csrc/distributed/c10d/ParamCommsUtils.hpp of the 2.0 era (RECORD_PARAM_COMMS_DATA
#   with seq, pg_ptr, rank, colName, split sizes: a ``record_param_comms`` op whose inputs are
#   the input tensors then six scalars/lists; no group name, no "Collective name" argument);
# * torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (profiling titles ``nccl:all_reduce``,
#   ``nccl:_all_gather_base``, ``nccl:_reduce_scatter_base``, ``nccl:send <rank>-><peer>``,
#   ``nccl:recv <rank><-<peer>`` with group ranks; the title is an async user-scope record
#   function over the input tensors, ended when the work completes);
# * pytorch/kineto tb_plugin/test/test_profiler.py (TestDistributed.test_distributed_nccl:
#   ``nccl:all_reduce`` with ``Input Dims`` [[2049000]] / ``Input type`` ["float"], its
#   ``ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)`` kernel linked by external id);
# * HolisticTraceAnalysis hta/configs/event_args_formats/event_args_1.0.0.yaml (argument names,
#   "In msg size" beside "In msg nelems") and Kineto's ``distributedInfo`` of that time:
#   ``{"backend": "nccl", "rank": R, "world_size": W}``, no ``pg_config``.

V20_KERNELS = {"all_reduce": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
               "_all_gather_base": "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)",
               "_reduce_scatter_base": "ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclWorkElem)",
               "send": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
               "recv": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
               "broadcast": "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)"}
V20_STREAM = 20  # NCCL's stream; compute runs on stream 7


def fsdp_v20_calls(rank: int) -> list[tuple[str, int, float]]:
    """FSDP (1.x, FULL_SHARD) on the world group of 4 GPUs, one step: (op, elements, ts µs).
    The forward and the backward all-gather a 1024-float shard, the gradients are
    reduce-scattered from 4096 floats, then the grad-norm all-reduces one float."""
    return [("_all_gather_base", 1024, 100.0), ("_all_gather_base", 1024, 300.0),
            ("_reduce_scatter_base", 4096, 500.0), ("all_reduce", 1, 700.0)]


def trace_v20(rank: int, world: int = 4, calls: list[tuple[str, int, float]] | None = None,
              step: int = 5) -> dict[str, Any]:
    """One rank's PyTorch 2.0 NCCL trace (see the comment above). A p2p op is written
    ``send 0->1`` / ``recv 1<-0`` (group ranks, as ProcessGroupNCCL titles it)."""
    ev: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 7,
         "tid": MAIN, "ts": 0.0, "dur": 1000.0, "args": {"External id": 1}}]
    ext, corr = 10, 1000

    def launch(ts: float, kernel: str, dur: float, ext_id: int) -> tuple[dict[str, Any], ...]:
        nonlocal corr
        corr += 1
        stream = V20_STREAM if kernel.startswith("nccl") else 7
        return ({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7,
                 "tid": MAIN, "ts": ts, "dur": 4.0,
                 "args": {"cbid": 211, "correlation": corr, "External id": ext_id}},
                {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream,
                 "ts": ts + 6.0, "dur": dur,
                 "args": {"queued": 0, "device": 0, "context": 1, "stream": stream,
                          "correlation": corr, "External id": ext_id}})

    for a, b in COMPUTE_US:
        ext += 1
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": MAIN,
                   "ts": float(a), "dur": float(b - a),
                   "args": {"External id": ext, "Record function id": 0,
                            "Input Dims": [[64, 64], [64, 64]], "Input type": ["float"] * 2}})
        ev.extend(launch(a + 1.0, "ampere_sgemm_128x64_nn", 30.0, ext))
    for k, (op, n, ts) in enumerate(calls or fsdp_v20_calls(rank)):
        base_op = op.split()[0]
        ext += 2
        tensors: Any = [[n]] if base_op in ("all_reduce", "send", "recv", "broadcast") else [n]
        ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 7,
                   "tid": MAIN, "ts": ts, "dur": 25.0,
                   "args": {"External id": ext - 1, "Record function id": 0, "Ev Idx": 2 * k,
                            "Input Dims": [tensors, [], [], [], [], [], []],
                            "Input type": ["TensorList" if isinstance(tensors[0], list)
                                           else "float", "Int", "Int", "Int", "String",
                                           "GenericList", "GenericList"]}})
        kernel_dur = 50.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"nccl:{op}", "pid": 7,
                   "tid": MAIN, "ts": ts + 5.0, "dur": 15.0 + kernel_dur,  # ends with the work
                   "args": {"External id": ext, "Record function id": 0, "Ev Idx": 2 * k + 1,
                            "Input Dims": [[n]], "Input type": ["float"]}})
        runtime, kernel = launch(ts + 8.0, V20_KERNELS[base_op], kernel_dur, ext - 1)
        ev.extend((runtime, kernel))
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"nccl:{op}", "pid": 0,
                   "tid": V20_STREAM, "ts": kernel["ts"], "dur": kernel_dur,
                   "args": {"External id": ext}})
    return {"schemaVersion": 1, "deviceProperties": [
                {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85198045184,
                 "computeMajor": 8, "computeMinor": 0, "numSms": 108}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": ev}


def world_trace(rank: int, world: int, calls: list[tuple[str, int, float, int]],
                step: int = 3) -> dict[str, Any]:
    """One rank's L1 trace of a job whose every call is on the world group of ``world`` ranks
    (``default_pg``): ``calls`` are (collective name, float elements, ts µs, the peer of a
    send or recv or -1)."""
    ranks = list(range(world))
    ev: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 7,
         "tid": MAIN, "ts": 0.0, "dur": 1000.0, "args": {}}]
    for k, (coll, n, ts, peer) in enumerate(calls):
        args = {"Collective name": coll, "dtype": "Float", "In msg nelems": n,
                "Out msg nelems": n, "Group size": world, "In split size": "[]",
                "Out split size": "[]", "Process Group Name": "0",
                "Process Group Description": "default_pg", "Process Group Ranks": str(ranks),
                "Ev Idx": k}
        if peer >= 0:
            args.update({"Rank": peer, "Dst Rank" if coll == "send" else "Src Rank": peer})
        ev.append({"ph": "X", "pid": 7, "tid": MAIN, "ts": ts, "dur": 20.0, "cat": "cpu_op",
                   "name": "record_param_comms", "args": args})
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world,
                                "pg_count": 1,
                                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg",
                                               "backend_config": "cuda:nccl",
                                               "pg_size": world, "ranks": ranks}]}}
