"""Experiment files, replay plans and run metrics (pure; no root)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from testbed.experiment.config import ExperimentError, load_experiment, parse_experiment
from testbed.metrics.compute import _union_length, compute_metrics, iteration_table, window_table
from testbed.plan.replay import PlanError, build_plan, scaled_bytes
from workloads import generate_schedule
from workloads.errors import WorkloadConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE = """\
cluster: {servers: 4, gpus_per_server: 1}
workload:
  model: llama3-8b
  seq_len: 1024
  parallelism: {fsdp: 2, pp: 2}
"""


@pytest.mark.parametrize("name", ["llama3-8b.yaml", "demo.yaml", "tiny.yaml"])
def test_examples_load(name: str) -> None:
    cfg = load_experiment(EXAMPLES / name)
    assert cfg.total_iterations >= 2 and cfg.text


def test_defaults_and_degree_aware_ports() -> None:
    cfg = parse_experiment(BASE + "mode: degree-aware\nocs: {switching_delay: piezo}\n")
    assert cfg.switching_delay_ms == 25.0
    assert cfg.effective_ports_per_rank == 2  # degree-aware needs a spare port
    assert cfg.replace(mode="baseline").switching_delay_ms == 0.0
    assert cfg.link_mbps is None  # auto: calibrated at run time


@pytest.mark.parametrize(("extra", "key", "line"), [
    ("mode: fast\n", "mode", 6),
    ("ocs: {switching_delay: warp}\n", "ocs.switching_delay", 6),
    ("ocs: {colour: blue}\n", "ocs.colour", 6),
    ("run: {iterations: 0}\n", "run.iterations", 6),
    ("network: {link_mbps: 5000}\n", "network.link_mbps", 6),
    ("ocs: {semantics: exact}\n", "ocs.semantics", 6),
    ("ocs: {request_points: sometimes}\n", "ocs.request_points", 6),
    ("ocs: {request_points: phase}\n", "ocs.request_points", 6),  # port-exact: every call asks
    ("mode: degree-aware\nocs: {semantics: rail-state}\n", "mode", 6),
    ("ocs: {semantics: rail-state, driver: polatis-tl1}\n", "ocs.driver", 6),
    ("run: {rank_cpu_quota: 1.5}\n", "run.rank_cpu_quota", 6),
    ("run: {rank_cpu_quota: 0}\n", "run.rank_cpu_quota", 6),
    ("run:\n  warmup: 1\n  rank_cpu_quota: most\n", "run.rank_cpu_quota", 8),
    ("run: {rank_cpu_quota: true}\n", "run.rank_cpu_quota", 6),
])
def test_bad_input_names_key_and_position(extra: str, key: str, line: int) -> None:
    with pytest.raises(WorkloadConfigError) as info:
        parse_experiment(BASE + extra, "exp.yaml")
    assert info.value.field == key
    assert info.value.position.startswith(f"exp.yaml:{line}:")


def test_rank_cpu_quota_is_off_by_default_and_validated_on_replace() -> None:
    assert parse_experiment(BASE).rank_cpu_quota is None
    cfg = parse_experiment(BASE + "run: {rank_cpu_quota: auto}\n")
    assert cfg.rank_cpu_quota == "auto" and cfg.to_json()["rank_cpu_quota"] == "auto"
    assert parse_experiment(BASE + "run: {rank_cpu_quota: 1}\n").rank_cpu_quota == 1.0
    assert cfg.replace(rank_cpu_quota=0.7).rank_cpu_quota == 0.7
    with pytest.raises(ExperimentError, match=r"half its CPU time\), got 2$") as info:
        cfg.replace(rank_cpu_quota=2)
    assert info.value.field == "run.rank_cpu_quota"


def test_interleaved_pipelines_are_refused_under_rail_state() -> None:
    text = BASE.replace("{fsdp: 2, pp: 2}", "{fsdp: 2, pp: 2, pp_schedule: interleaved, "
                        "virtual_stages: 2}")
    text += "  num_microbatches: 4\nocs: {semantics: rail-state}\n"
    with pytest.raises(WorkloadConfigError) as info:
        parse_experiment(text, "exp.yaml")
    assert info.value.field == "workload.parallelism.pp_schedule"
    assert info.value.position.startswith("exp.yaml:5:")


def test_driver_simulated_is_refused_with_its_position() -> None:
    """The sim backend is --backend sim; a file naming the simulated driver is a bad value."""
    with pytest.raises(WorkloadConfigError) as info:
        parse_experiment(BASE + "ocs:\n  switching_delay: 10\n  driver: simulated\n",
                         "exp.yaml")
    assert str(info.value) == ("exp.yaml:8:11: ocs.driver: must be one of emulated, "
                               "polatis-netconf, polatis-tl1, calient-tl1, got 'simulated'")
    with pytest.raises(ExperimentError, match=r"ocs\.driver"):
        parse_experiment(BASE).replace(driver="simulated")
    assert parse_experiment(BASE + "ocs: {driver: polatis-tl1}\n").driver == "polatis-tl1"


def test_replace_validates() -> None:
    cfg = parse_experiment(BASE)
    with pytest.raises(ExperimentError, match="mode"):
        cfg.replace(mode="nope")


def test_scaled_bytes_keeps_a_byte() -> None:
    assert scaled_bytes(0, 1e-4) == 0
    assert scaled_bytes(3, 1e-4) == 1
    assert scaled_bytes(10**9, 1e-4) == 10**5


def _llama_plan(scale: float = 1e-4):  # type: ignore[no-untyped-def]
    cfg = load_experiment(EXAMPLES / "llama3-8b.yaml")
    schedule = generate_schedule(cfg.workload)
    return schedule, build_plan(schedule, scale=scale)


def test_plan_transfers_match_between_peers() -> None:
    _schedule, plan = _llama_plan()
    sent: Counter[tuple[str, int, int, int]] = Counter()
    recv: Counter[tuple[str, int, int, int]] = Counter()
    for rank, ops in plan.programs.items():
        for op in ops:
            for k, step in enumerate(op.steps):
                for peer, n in step.sends:
                    sent[(op.collective_id, k if op.kind not in ("send",) else 0, rank, peer)] += n
                for peer, n in step.recvs:
                    recv[(op.collective_id, k if op.kind not in ("recv",) else 0, peer, rank)] += n
    assert sent == recv  # every byte sent is expected by exactly its receiver, step by step


def test_plan_pair_groups_have_equal_call_counts() -> None:
    _schedule, plan = _llama_plan()
    calls: Counter[tuple[str, int]] = Counter()
    for rank, ops in plan.programs.items():
        for op in ops:
            if op.is_call:
                calls[(op.lane, rank)] += 1
    for gid, group in plan.groups.items():
        counts = {calls[(gid, r)] for r in group.ranks}
        assert len(counts) == 1, (gid, counts)  # members ask for the same calls


def test_plan_keeps_compute_time_and_order() -> None:
    schedule, plan = _llama_plan()
    for rank in (0, 8):
        compute_s = sum(op.duration_s for op in plan.programs[rank] if not op.is_call)
        modeled = sum(op.duration_s for op in schedule.ops_of(rank) if op.kind == "compute")
        assert compute_s >= modeled  # plus scale-up collectives on NVLink
        for op in plan.programs[rank]:
            assert all(d < op.index for d in op.deps)


def test_plan_refuses_rings_across_rails() -> None:
    cfg = parse_experiment("cluster: {servers: 2, gpus_per_server: 4}\n"
                           "workload: {model: llama3-8b, parallelism: {tp: 2, fsdp: 4}}\n")
    with pytest.raises(PlanError, match="across rails"):
        build_plan(generate_schedule(cfg.workload), scale=1e-4)


def test_union_length() -> None:
    assert _union_length([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)
    assert _union_length([]) == 0.0


def _call(rank: int, it: int, cid: str, axis: str, kind: str, t_ack: float, t_end: float,
          lane: str) -> dict[str, object]:
    return {"ev": "call", "rank": rank, "it": it, "i": 0, "lane": lane, "kind": kind,
            "axis": axis, "cid": cid, "tag": cid, "seq": it, "reconfigured": False,
            "t_intent": t_ack - 0.01, "t_ack": t_ack, "t_end": t_end, "sent": 1000,
            "received": 1000, "expected": 1000, "size_bytes": 2 << 20, "wire_bytes": 1000}


def test_metrics_on_synthetic_records() -> None:
    records: list[dict[str, object]] = []
    for rank in (0, 1):
        for it in range(3):
            t0 = it * 1.0
            records.append({"ev": "iteration", "rank": rank, "it": it, "t_start": t0,
                            "t_end": t0 + 0.9 + 0.05 * rank})
            records.append(_call(rank, it, f"fsdp0:ag{it}", "fsdp", "all_gather", t0 + 0.1,
                                 t0 + 0.2, "fsdp0"))
            records.append(_call(rank, it, f"pp0:s{it}", "pp", "send", t0 + 0.5, t0 + 0.6,
                                 "p2p0-1"))
    events = [{"event": "intent", "t_s": 1.0, "group": "g", "seq": 0},
              {"event": "intent", "t_s": 1.2, "group": "g", "seq": 0},
              {"event": "ack", "t_s": 1.3, "group": "g", "seq": 0},
              {"event": "reconfig_end", "rail": 0, "decision": 1, "t_dark_s": 1.2,
               "t_light_s": 1.29, "dark_ms": 90.0, "added": [[1, 2]], "removed": []}]
    rows = iteration_table(records, warmup=1)
    assert [r["iteration_time_s"] for r in rows] == pytest.approx([0.95, 1.0, 1.0])
    m = compute_metrics(records, events, warmup=1, link_mbps=8.0, scale=1e-4, num_rails=1)
    assert m.summary["iteration_time_s"] == pytest.approx(1.0)
    assert m.summary["exposed_reconfig_s"] == pytest.approx(0.05)  # 0.1 s over 2 iterations
    assert m.summary["reconfigurations"] == 1
    assert m.summary["calls_delivered"] == m.summary["calls"] == 12
    windows = window_table(m.calls, warmup=1)
    # per rank and measured iteration: AG phase ends 0.2, PP phase's last member joins at
    # 0.49 (its intent; the ack at 0.5 is not the start) -> 0.29 s window
    assert sorted(round(w["window_s"], 6) for w in windows if w["from"] == "fsdp/allgather"
                  ) == [0.29] * 4  # FSDP's phase named by its group axis, not its family dp
