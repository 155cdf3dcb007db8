"""A torch run's call records -> schedule (testbed.torchjob.capture), and its replay.

``data/capture-2x2.jsonl.gz`` is the research capture of the tiny Llama job (FSDP2 x PP 1F1B,
4 ranks, 3 steps, torch 2.13 CPU; /work/wt/design/issue14-scratch/capture-2x2) converted to the
records contract of the torch backend: the prototype wrote separate ``wait`` lines and
``iteration_end`` marks, which became the call's ``t_wait_start``/``t_wait_end`` and
``iteration`` lines (each iteration starting where the previous one ended); ``axis`` comes from
the group descriptor, ``op`` from the kind. Its sizes and counts are those of the real job.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from testbed.cli.main import main
from testbed.torchjob.capture import CaptureError, last_iteration, schedule_from_records

DATA = Path(__file__).parent / "data"


def call(rank: int, it: int, i: int, kind: str, members: list[int], t: float,
         wait: tuple[float, float] | None = None, peer: int | None = None,
         size: int = 4096, axis: str = "fsdp") -> dict[str, Any]:
    """A call record as the torch backend writes it (replayer fields + torch fields)."""
    return {"ev": "call", "rank": rank, "it": it, "i": i, "lane": f"{axis}0", "kind": kind,
            "axis": axis, "cid": f"{axis}0:{i}", "tag": str(i), "seq": i,
            "reconfigured": False, "t_intent": t, "t_ack": t, "t_end": t + 0.1, "sent": 0,
            "received": 0, "expected": 0, "size_bytes": size, "wire_bytes": size,
            "op": kind, "members": members, "peer": peer, "dtype": "float32", "t_issue": t,
            "t_wait_start": wait[0] if wait else None, "t_wait_end": wait[1] if wait else None,
            "torch_group": f"mesh_{axis}"}


def iteration(rank: int, it: int, t0: float, t1: float) -> dict[str, Any]:
    return {"ev": "iteration", "rank": rank, "it": it, "t_start": t0, "t_end": t1}


def two_ranks() -> dict[int, list[dict[str, Any]]]:
    """Two FSDP ranks, two iterations: one all-gather in it 0, all-gather + reduce-scatter in
    it 1 (the reduce-scatter issued first but written last, as records are written at the
    end of a call)."""
    out = {}
    for r in (0, 1):
        out[r] = [call(r, 0, 0, "all_gather", [0, 1], 0.5, (0.6, 0.7)), iteration(r, 0, 0, 1),
                  call(r, 1, 2, "all_gather", [0, 1], 1.6, (1.7, 1.8)),
                  call(r, 1, 1, "reduce_scatter", [0, 1], 1.2, size=8192),
                  iteration(r, 1, 1.0, 2.0)]
    return out


def load_capture() -> dict[int, list[dict[str, Any]]]:
    recs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    with gzip.open(DATA / "capture-2x2.jsonl.gz", "rt") as fh:
        for line in fh:
            rec = json.loads(line)
            recs[rec["rank"]].append(rec)
    return recs


def test_records_of_one_iteration_become_ops_in_issue_order() -> None:
    recs = two_ranks()
    assert last_iteration(recs) == 1
    s = schedule_from_records(recs, iteration=1, gpus_per_server=1, sources=["a", "b"],
                              torch_version="2.13.0")
    ops = s.ops_of(0)
    assert [(o.kind, o.tag, o.deps, round(o.duration_s, 6)) for o in ops] == [
        ("compute", "compute.0", (), 0.2),          # 1.0 -> 1.2 issue of the reduce-scatter
        ("reduce_scatter", "fsdp0.c0", (0,), 0.0),
        ("compute", "compute.2", (0,), 0.4),        # 1.2 -> 1.6 issue of the all-gather
        ("all_gather", "fsdp0.c1", (2,), 0.0),
        ("compute", "compute.4", (2,), 0.1),        # 1.6 -> 1.7, then waits until 1.8
        ("compute", "compute.5", (3, 4), 0.2),      # 1.8 -> 2.0 after the wait
    ]
    assert s.origin == {"kind": "torch-capture", "sources": ["a", "b"],
                        "torch_version": "2.13.0", "iteration": 1}
    first = schedule_from_records(recs, iteration=0, gpus_per_server=1)
    assert [o.kind for o in first.ops_of(1) if o.is_collective] == ["all_gather"]


def test_missing_or_broken_records_are_refused_with_rank_and_call() -> None:
    recs = two_ranks()
    with pytest.raises(CaptureError, match="rank 0: no 'iteration' record for iteration 5"):
        schedule_from_records(recs, iteration=5, gpus_per_server=1)
    del recs[1][2]["members"]
    with pytest.raises(CaptureError, match=r"rank 1 call 2 \(all_gather on mesh_fsdp\): bad "
                                           r"call record \(KeyError: 'members'\)"):
        schedule_from_records(recs, iteration=1, gpus_per_server=1)
    recs = two_ranks()
    recs[1] = [r for r in recs[1] if r.get("kind") != "reduce_scatter"]
    with pytest.raises(CaptureError, match="fsdp0: rank 0 has 2 calls in the iteration, "
                                           "rank 1 has 1"):
        schedule_from_records(recs, iteration=1, gpus_per_server=1)
    with pytest.raises(CaptureError, match="no iteration was finished by every rank"):
        last_iteration({0: [iteration(0, 0, 0, 1)], 1: []})


def test_all_to_all_without_splits_is_split_evenly() -> None:
    recs = {r: [call(r, 0, 0, "all_to_all", [0, 1], 0.5, size=10, axis="ep"),
                iteration(r, 0, 0, 1)] for r in (0, 1)}
    s = schedule_from_records(recs, iteration=0, gpus_per_server=1)
    assert s.programs[0].ops[1].split == (5, 5)
    assert s.ops_of(1)[1].wire_bytes == 5


def test_the_research_capture_gives_the_jobs_collectives() -> None:
    recs = load_capture()
    it = last_iteration(recs)
    assert it == 2
    s = schedule_from_records(recs, iteration=it, gpus_per_server=1)
    assert s.groups["pp"].ranks.tolist() == [[0, 2], [1, 3]]
    assert s.groups["fsdp"].ranks.tolist() == [[0, 1], [2, 3]]
    for rank in range(4):
        ops = [o for o in s.ops_of(rank) if o.is_collective]
        # V2 of the design note: 15 all-gathers, 3 reduce-scatters, 4 sends, 4 receives
        assert Counter((o.axis, o.kind) for o in ops) == {
            ("fsdp", "all_gather"): 15, ("fsdp", "reduce_scatter"): 3,
            ("pp", "send"): 4, ("pp", "recv"): 4}
        root = 131072 if rank < 2 else 131328  # embedding / norm + output shard, fp32
        assert {o.size_bytes for o in ops if o.kind == "all_gather"} == {root, 328192}
        assert {o.size_bytes for o in ops if o.kind in ("send", "recv")} == {65536}
        assert {o.peer for o in ops if o.kind in ("send", "recv")} == {(rank + 2) % 4}
    compute = sum(o.duration_s for o in s.ops_of(0) if not o.is_collective)
    assert 0.1 < compute < 0.6  # main-thread time of a 0.59 s iteration, waits excluded


def test_a_captured_schedule_replays_on_the_sim_backend(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    s = schedule_from_records(load_capture(), iteration=2, gpus_per_server=1)
    s.to_json(str(tmp_path / "workload.json"))
    (tmp_path / "replay.yaml").write_text(
        "cluster: {servers: 4, gpus_per_server: 1}\nworkload: {schedule: workload.json}\n"
        "mode: on-demand\nocs: {switching_delay: 10}\nrun: {warmup: 1, iterations: 1}\n")
    code = main(["run", str(tmp_path / "replay.yaml"), "--backend", "sim", "--json",
                 "--out", str(tmp_path / "out")])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["all_iterations_completed"] is True
    assert summary["reconfigurations"] > 0  # FSDP and PP pairs take turns on rail 0


def test_generated_and_captured_differ_only_as_documented() -> None:
    """The differences workloads/FORMAT.md lists for the shipped tiny job, and no others."""
    from workloads.compare import compare, load_any

    generated = load_any(Path(__file__).parents[2] / "examples" / "torch"
                         / "llama-tiny-generated.yaml")
    captured = schedule_from_records(load_capture(), iteration=2, gpus_per_server=1)
    rep = compare(generated, captured)
    for rank in (0, 2):
        v = rep["ranks"][str(rank)]
        calls = {side: Counter() for side in ("a", "b")}
        for side in ("a", "b"):
            for p in v[side]:
                calls[side][(p["axis"], p["kind"])] += p["calls"]
        # the generator's reshard rule under PP: 15 all-gathers per rank and step, as captured
        assert calls["a"][("dp", "allgather")] == calls["b"][("dp", "allgather")] == 15
        assert calls["a"][("dp", "reducescatter")] == calls["b"][("dp", "reducescatter")] == 3
        assert calls["a"][("pp", "sendrecv")] == calls["b"][("pp", "sendrecv")] == 8
        # the one difference: the generator's gradient-norm all-reduces end its iteration
        assert calls["a"][("dp", "allreduce")] == calls["a"][("pp", "allreduce")] == 1
        assert ("dp", "allreduce") not in calls["b"] and ("pp", "allreduce") not in calls["b"]
        phases = {side: [(p["axis"], p["kind"], p["calls"]) for p in v[side]]
                  for side in ("a", "b")}
        assert phases["a"][-2:] == [("dp", "allreduce", 1), ("pp", "allreduce", 1)]
        assert phases["a"][:-2] == phases["b"]  # same phases, in the same order, otherwise
        # the reduce-scatters form one phase at the end of the iteration on both sides
        assert phases["b"][-1] == ("dp", "reducescatter", 3)
        # the extra PP<->DP boundary is the gradient-norm pair
        assert v["boundaries"]["a"] == v["boundaries"]["b"] + 1
    # call for call (the job's stage root is its own FSDP unit: gathered first in a forward,
    # reduced first; `fsdp_unit: block-root`), apart from the gradient-norm all-reduces
    for rank in range(4):
        calls_of = {side: [(o.kind, o.size_bytes) for o in s.ops_of(rank) if o.is_collective]
                    for side, s in (("a", generated), ("b", captured))}
        assert calls_of["a"][:-2] == calls_of["b"]
