"""The Kineto importer (workloads.kineto) on real and synthetic torch.profiler traces.

Real: ``data/kineto-fsdp2-pp2`` (torch 2.13 CPU/gloo, layout L3; its README says how it was
made). Synthetic (``kineto_traces.py``, built from the documented key names): L1, L1-GPU, L2,
L4 and the refusals.
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from kineto_traces import COMPUTE_US, job_calls, trace, write

from workloads.kineto import (
    Imported,
    KinetoError,
    detect_layout,
    import_traces,
    iterations,
    kind_of,
    load_trace,
    raw_calls,
)

REAL = Path(__file__).parent / "data" / "kineto-fsdp2-pp2"
REAL_PATHS = [REAL / f"rank{r}.json.gz" for r in range(4)]


def real_docs() -> dict[int, dict[str, Any]]:
    out = {}
    for r, p in enumerate(REAL_PATHS):
        with gzip.open(p, "rt") as fh:
            out[r] = json.load(fh)
    return out


def collectives(schedule: Any, rank: int) -> list[tuple[str, str, int]]:
    return [(o.axis, o.kind, o.size_bytes) for o in schedule.ops_of(rank) if o.is_collective]


@functools.cache
def real_import() -> Imported:
    return import_traces(REAL_PATHS)


def test_real_l3_traces_give_the_jobs_calls_and_groups() -> None:
    imp = real_import()
    s = imp.schedule
    assert imp.layouts == {r: "L3" for r in range(4)} and imp.step == "ProfilerStep 1"
    assert s.groups["pp"].ranks.tolist() == [[0, 2], [1, 3]]
    assert s.groups["fsdp"].ranks.tolist() == [[0, 1], [2, 3]]
    for rank in range(4):
        calls = collectives(s, rank)
        assert Counter((a, k) for a, k, _ in calls) == {
            ("fsdp", "all_gather"): 6, ("fsdp", "reduce_scatter"): 2,
            ("pp", "send"): 2, ("pp", "recv"): 2}
        root = 16384 if rank < 2 else 16512  # see data/kineto-fsdp2-pp2/README.md
        assert {b for _, k, b in calls if k == "all_gather"} == {root, 82176}
        assert {b for _, k, b in calls if k == "reduce_scatter"} == {2 * root, 2 * 82176}
        assert {b for _, k, b in calls if k in ("send", "recv")} == {8192}
        # compute is main-thread time without waits: positive, below the step's wall time
        assert 0.01 < sum(o.duration_s for o in s.ops_of(rank)) < 0.3
    assert s.origin is not None and s.origin["kind"] == "kineto"
    assert s.origin["iteration"] == "ProfilerStep 1"


def test_real_traces_without_profiler_steps_use_the_optimizer_steps() -> None:
    t = load_trace(REAL_PATHS[0])
    step = next(e for e in t.events if e["name"] == "ProfilerStep#1")
    t.events = [e for e in t.events if not e["name"].startswith("ProfilerStep")]
    t.layout = detect_layout(t)
    how, spans = iterations(t)
    assert how == "optimizer step" and list(spans) == [0]
    t0, t1 = spans[0]  # from the trace's start to the end of the optimizer step, which
    assert t0 <= step["ts"] and t1 >= step["ts"] + step["dur"]  # ends after its hooks
    assert Counter(c.kind for c in raw_calls(t, t0, t1)) == {
        "all_gather": 6, "reduce_scatter": 2, "send": 2, "recv": 2}


def test_waits_are_inferred_where_the_main_thread_idled_until_a_call_ended() -> None:
    s = real_import().schedule
    ops = s.ops_of(2)
    waited = {d for o in ops if not o.is_collective for d in o.deps if ops[d].is_collective}
    # stage 1 starts by waiting for its first activation: the compute after depends on it
    first_recv = next(o.index for o in ops if o.kind == "recv")
    assert first_recv in waited


@pytest.mark.parametrize("layout", ["L1", "L2", "L4"])
def test_synthetic_layouts_give_the_same_schedule(tmp_path: Path, layout: str) -> None:
    paths = write(tmp_path, {r: trace(r, layout) for r in range(4)}, gz=layout == "L2")
    imp = import_traces(paths)
    assert set(imp.layouts.values()) == {layout} and imp.step == "ProfilerStep 3"
    s = imp.schedule
    assert s.groups["fsdp"].ranks.tolist() == [[0, 1], [2, 3]]
    assert s.groups["pp"].ranks.tolist() == [[0, 2], [1, 3]]
    assert collectives(s, 0) == [("fsdp", "all_gather", 4096), ("pp", "send", 8192),
                                 ("fsdp", "reduce_scatter", 8192)]
    assert collectives(s, 3) == [("fsdp", "all_gather", 4224), ("pp", "recv", 8192),
                                 ("fsdp", "reduce_scatter", 8448)]
    send = next(o for o in s.ops_of(1) if o.kind == "send")
    assert send.peer == 3


def test_l1_gpu_compute_is_the_kernel_time(tmp_path: Path) -> None:
    paths = write(tmp_path, {r: trace(r, "L1", gpu=True) for r in range(4)})
    imp = import_traces(paths)
    assert set(imp.layouts.values()) == {"L1-GPU"}
    compute = [o.duration_s for o in imp.schedule.ops_of(0) if not o.is_collective]
    assert compute and all(d == pytest.approx(30e-6) for d in compute)  # one 30 µs sgemm each
    assert len(compute) == len(COMPUTE_US)


def test_calls_on_one_member_groups_are_dropped_and_all_to_all_keeps_its_splits(
        tmp_path: Path) -> None:
    docs = {}
    for r in range(4):
        doc = trace(r, "L1")
        a2a = copy.deepcopy(next(e for e in doc["traceEvents"]
                                 if e["name"] == "record_param_comms"))
        a2a["ts"] = 700.0
        a2a["args"].update({"Collective name": "all_to_allv", "In msg nelems": 30,
                            "In split size": "[10, 20]" if r % 2 == 0 else "[5, 25]"})
        lone = copy.deepcopy(a2a)
        lone["ts"] = 800.0
        lone["args"].update({"Collective name": "allreduce", "Group size": 1,
                             "Process Group Ranks": f"[{r}]"})
        doc["traceEvents"] += [a2a, lone]
        docs[r] = doc
    s = import_traces(write(tmp_path, docs), axes={"mesh_fsdp": "ep"}).schedule
    a2a_op = next(o for o in s.ops_of(0) if o.kind == "all_to_all")
    assert a2a_op.axis == "ep" and s.program(0).ops[a2a_op.index].split == (40, 80)
    assert a2a_op.wire_bytes == 80
    assert not any(o.kind == "all_reduce" for o in s.ops_of(0))


def test_kind_names_in_every_spelling() -> None:
    assert kind_of("_allgather_base") == kind_of("allgather_into_tensor_coalesced") \
        == "all_gather"
    assert kind_of("_reduce_scatter_base") == kind_of("reduce_scatter_tensor_coalesced") \
        == "reduce_scatter"
    assert kind_of("allreduce") == kind_of("allreduce_coalesced") == "all_reduce"
    assert kind_of("all_to_allv") == kind_of("alltoall_base") == "all_to_all"
    assert kind_of("broadcast") is None and kind_of("barrier") is None


def test_layout_detection_by_keys(tmp_path: Path) -> None:
    layouts = {}
    for name in ("L1", "L2", "L4"):
        write(tmp_path / name, {0: trace(0, name)})
        layouts[name] = detect_layout(load_trace(tmp_path / name / "rank0.json"))
    assert layouts == {"L1": "L1", "L2": "L2", "L4": "L4"}
    assert detect_layout(load_trace(REAL_PATHS[0])) == "L3"


def refusal(tmp_path: Path, docs: dict[int, Any], **kw: Any) -> str:
    paths = write(tmp_path, docs)
    with pytest.raises(KinetoError) as err:
        import_traces(paths, **kw)
    return str(err.value)


def test_an_unmappable_collective_is_refused_with_file_and_event(tmp_path: Path) -> None:
    docs = {r: trace(r, "L1") for r in range(4)}
    docs[2]["traceEvents"][-1]["args"]["Collective name"] = "broadcast"
    msg = refusal(tmp_path, docs)
    assert "rank2.json: event 'record_param_comms' at ts 530.0 (Ev Idx 2)" in msg
    assert "collective 'broadcast' cannot be mapped" in msg


def test_calls_outside_the_imported_iteration_are_not_looked_at(tmp_path: Path) -> None:
    docs = {r: trace(r, "L1") for r in range(4)}
    for doc in docs.values():  # a start-up broadcast before the profiled step
        start = copy.deepcopy(doc["traceEvents"][-1])
        start.update(ts=-500.0)
        start["args"]["Collective name"] = "broadcast"
        doc["traceEvents"].append(start)
    imp = import_traces(write(tmp_path / "step", docs))
    assert [k for _, k, _ in collectives(imp.schedule, 0)] == ["all_gather", "send",
                                                              "reduce_scatter"]
    for doc in docs.values():
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e["name"] != "ProfilerStep#3"]
    with pytest.raises(KinetoError, match="collective 'broadcast' cannot be mapped"):
        import_traces(write(tmp_path / "whole", docs))  # the whole trace is the iteration


def test_traces_that_disagree_are_refused(tmp_path: Path) -> None:
    docs = {r: trace(r, "L2") for r in range(4)}
    docs[1] = trace(1, "L2", calls=job_calls(1)[:2])  # rank 1 lost its reduce-scatter
    msg = refusal(tmp_path, docs)
    assert "json: event 'nccl:reduce_scatter' at ts" in msg
    assert "reduce_scatter of 8192 B could be on group" in msg
    assert "no other member has a matching call for it (ranks whose traces disagree" in msg


def _world_docs(extra: Sequence[tuple[str, str, int, float, int]] = ()
                ) -> dict[int, dict[str, Any]]:
    """Each rank all-reduces once on the world group (``default_pg``), plus ``extra``."""
    docs = {r: trace(r, "L1", calls=[("allreduce", "0", 1, 100.0, -1), *extra])
            for r in range(4)}
    for d in docs.values():
        for e in d["traceEvents"]:
            if e["name"] == "record_param_comms" and e["args"]["Process Group Name"] == "0":
                e["args"]["Group size"] = 4
    return docs


def test_a_job_only_on_the_world_group_is_data_parallel(tmp_path: Path) -> None:
    """Plain DDP: torch's only group is default_pg; its all-reduce is the dp axis."""
    imp = import_traces(write(tmp_path, _world_docs()))
    s = imp.schedule
    assert s.config.parallel.dp == 4 and "default_pg (torch's world group" in imp.notes[0]
    assert collectives(s, 0) == [("dp", "all_reduce", 4)]


def test_the_world_group_beside_another_axis_needs_an_axis(tmp_path: Path) -> None:
    docs = _world_docs([("_allgather_base", "3", 1024, 300.0, -1)])
    msg = refusal(tmp_path, docs)
    assert "group default_pg [0, 1, 2, 3] has no schedule axis" in msg
    assert "--axis default_pg=AXIS" in msg
    s = import_traces(write(tmp_path / "named", docs), axes={"default_pg": "dp"}).schedule
    assert [a for a, _, _ in collectives(s, 0)] == ["dp", "fsdp"]


@pytest.mark.parametrize(("change", "words"), [
    (lambda d: d[1].pop("distributedInfo"), ["rank1.json: no distributedInfo.rank"]),
    (lambda d: d.pop(3), ["3 ranks of a 4-rank job: the traces of ranks [3] are missing"]),
    (lambda d: [d.pop(r) for r in (1, 2, 3)],
     ["a single rank of a 4-rank job: the traces of ranks [1, 2, 3] are missing"]),
    (lambda d: d[2].update(traceEvents=[]), ["rank2.json: empty: no complete", "on_trace_ready"]),
    (lambda d: d[2].update(traceEvents=[{"ph": "M", "name": "process_name", "pid": 7}]),
     ["rank2.json: empty"]),
    (lambda d: [e.update(name="my_op") for e in d[1]["traceEvents"]
                if e["name"] == "record_param_comms"],
     ["rank1.json: unknown layout: no collective call"]),
    (lambda d: d[2]["distributedInfo"].update(rank=0), ["rank 0 again"]),
    (lambda d: d[1]["distributedInfo"].update(world_size=8), ["world_size 8"]),
    (lambda d: d[0].update(traceEvents="x"), ["rank0.json: not a torch.profiler Chrome trace"]),
])
def test_bad_trace_sets_are_refused_naming_the_file(tmp_path: Path, change: Any,
                                                    words: list[str]) -> None:
    docs = {r: trace(r, "L1") for r in range(4)}
    change(docs)
    msg = refusal(tmp_path, docs)
    for word in words:
        assert word in msg


def test_a_step_without_collectives_is_refused(tmp_path: Path) -> None:
    docs = {r: trace(r, "L1", calls=[(c, g, n, ts + 2000.0, peer)
                                     for c, g, n, ts, peer in job_calls(r)]) for r in range(4)}
    msg = refusal(tmp_path, docs)
    assert "no collective call in ProfilerStep 3 of any trace" in msg and "--step" in msg


def test_unreadable_files_and_missing_steps_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(KinetoError, match=r"rank0\.json\.gz: not a Chrome trace"):
        load_trace(bad)
    with pytest.raises(KinetoError, match="cannot read it"):
        load_trace(tmp_path / "absent.json")
    text = json.dumps(trace(0, "L1"))
    (tmp_path / "cut.json").write_text(text[:len(text) // 2])
    with pytest.raises(KinetoError, match=r"cut\.json: truncated: the JSON ends at byte"):
        load_trace(tmp_path / "cut.json")
    with gzip.open(tmp_path / "cut.json.gz", "wt") as fh:
        fh.write(text)
    data = (tmp_path / "cut.json.gz").read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(data[:len(data) // 2])
    with pytest.raises(KinetoError, match=r"cut\.json\.gz: truncated: the compressed file"):
        load_trace(tmp_path / "cut.json.gz")
    (tmp_path / "zero.json").write_text("")
    with pytest.raises(KinetoError, match=r"zero\.json: empty file"):
        load_trace(tmp_path / "zero.json")
    with pytest.raises(KinetoError, match=r"has no ProfilerStep 7 \(it has \[1\]\); choose one "
                                          "with --step"):
        import_traces(REAL_PATHS, step=7)


def _warp_times(doc: dict[str, Any], rng: random.Random, offset_us: float) -> None:
    """Move every time point of one trace by a strictly increasing random map (each gap
    scaled by 0.2-5x, the whole trace shifted by ``offset_us``): the rank's own order of
    events survives, durations and any alignment with other ranks' clocks do not."""
    events = doc["traceEvents"]
    points = sorted({float(e["ts"]) for e in events if "ts" in e}
                    | {float(e["ts"]) + float(e["dur"]) for e in events if "dur" in e})
    new, t = {}, offset_us
    for prev, p in zip([points[0], *points], points, strict=False):
        t += (p - prev) * rng.uniform(0.2, 5.0)
        new[p] = t
    for e in events:
        if "ts" in e:
            start = float(e["ts"])
            if "dur" in e:
                e["dur"] = new[start + float(e["dur"])] - new[start]
            e["ts"] = new[start]
    rng.shuffle(events)


def _groups_and_calls(s: Any) -> tuple[Any, ...]:
    return (s.groups["pp"].ranks.tolist(), s.groups["fsdp"].ranks.tolist(),
            [[(o.axis, o.kind, o.size_bytes, o.peer) for o in s.ops_of(r) if o.is_collective]
             for r in range(4)])


@pytest.mark.parametrize("seed", [1, 2])
def test_groups_do_not_depend_on_timing_across_ranks(tmp_path: Path, seed: int) -> None:
    """The recorded traces with each rank's clock warped and shifted by seconds (and events
    shuffled) import to the same groups and calls, in the same order per rank."""
    expected = _groups_and_calls(real_import().schedule)
    rng = random.Random(seed)
    docs = real_docs()
    for rank, doc in docs.items():
        _warp_times(doc, rng, offset_us=rng.uniform(-5e6, 5e6) + rank * 1e6)
    assert _groups_and_calls(import_traces(write(tmp_path, docs)).schedule) == expected


def test_l3_traces_without_their_gloo_worker_threads_are_ambiguous(tmp_path: Path) -> None:
    """The pipeline and FSDP pairs both carry 82176 B all-gathers: only the gloo worker
    thread that ran each call (one group's threads) tells them apart, so without it the
    import is refused, naming the file and the event, rather than guessed."""
    docs = real_docs()
    for doc in docs.values():
        main_tid = next(e["tid"] for e in doc["traceEvents"]
                        if e.get("name", "").startswith("c10d::"))
        for e in doc["traceEvents"]:
            if e.get("name", "").startswith("gloo:"):
                e["tid"] = main_tid
    msg = refusal(tmp_path, docs)
    assert "rank0.json: event 'c10d::" in msg and "fits group mesh_pp [0, 2] or mesh_fsdp " \
        "[0, 1] alike" in msg and "does not name the group" in msg


def test_l2_traces_whose_groups_only_timing_could_tell_apart_are_refused(
        tmp_path: Path) -> None:
    """Equal sizes on every rank: the all-gather fits the FSDP pair, the pipeline pair and the
    world group alike; the old importer picked one by time, now it is refused."""
    same = {r: [(c, g, n - 32 * (r // 2) if c == "_allgather_base" else
                 n - 64 * (r // 2) if c == "_reduce_scatter_base" else n, ts, p)
                for c, g, n, ts, p in job_calls(r)] for r in range(4)}
    msg = refusal(tmp_path, {r: trace(r, "L2", calls=same[r]) for r in range(4)})
    assert "rank0.json: event 'nccl:" in msg and "alike" in msg
