"""The planner: the scale bench's plans are build_plan's, and shared work changes nothing."""

from __future__ import annotations

import pytest

from controller.job import rail_job_ports
from testbed.experiment.config import ExperimentConfig, parse_experiment
from testbed.plan.replay import Step, build_plan, scaled_bytes
from testbed.simulator.bench import plan_bench
from workloads import generate_schedule
from workloads.schedule import Op, Schedule

DENSE = ("{name: dense, vocab_size: 32001, hidden_size: 520, n_layers: 4, n_heads: 8, "
         "n_kv_heads: 4, ffn_hidden_size: 1500}")
MOE = ("{name: moe, vocab_size: 32001, hidden_size: 520, n_layers: 4, n_heads: 8, n_kv_heads: 4, "
       "ffn_hidden_size: 1500, n_experts: 4, top_k: 2, moe_ffn_hidden_size: 700}")

# (servers, gpus per server, model, parallelism, micro-batches, seq_len, ports per rank, rails
# the bench plans): rail-aligned layouts with every collective kind, scale-up groups whose byte
# split differs by position (TP 3 of 100 tokens), and ports per rank from 1 to 4. The byte scale
# is 1, so that chunks one byte apart stay apart in the plans.
CASES = {
    "fsdp2-pp2": (4, 1, DENSE, "{fsdp: 2, pp: 2}", 2, 96, 1, 1),
    "tp2-sp-fsdp2-pp2": (4, 2, DENSE, "{tp: 2, sp: true, fsdp: 2, pp: 2}", 4, 96, 2, 2),
    "tp2-cp2-dp2": (4, 2, DENSE, "{tp: 2, cp: 2, dp: 2}", 1, 96, 4, 1),
    "tp2-fsdp4-ep2": (4, 2, MOE, "{tp: 2, fsdp: 4, ep: 2}", 2, 96, 2, 2),
    "tp2-fsdp2-pp2-interleaved": (4, 2, DENSE, "{tp: 2, fsdp: 2, pp: 2, virtual_stages: 2, "
                                  "pp_schedule: interleaved}", 4, 96, 1, 2),
    "tp3-fsdp3-uneven": (3, 3, DENSE, "{tp: 3, fsdp: 3}", 2, 100, 2, 3),
    "dp3-pp2": (6, 1, DENSE, "{dp: 3, pp: 2}", 3, 96, 2, 1),
}


def case(name: str) -> tuple[ExperimentConfig, Schedule, int]:
    servers, gpus, model, par, microbatches, seq_len, ports, rails = CASES[name]
    cfg = parse_experiment(
        f"name: {name}\ncluster: {{servers: {servers}, gpus_per_server: {gpus}}}\n"
        f"workload: {{model: {model}, seq_len: {seq_len}, num_microbatches: {microbatches}, "
        f"parallelism: {par}}}\n"
        f"ocs: {{ports_per_rank: {ports}}}\nnetwork: {{link_mbps: 1000, rail_gbps: 1}}\n")
    return cfg, generate_schedule(cfg.workload), rails


def plan_args(cfg: ExperimentConfig) -> dict[str, float]:
    assert cfg.link_mbps is not None
    return {"scale": cfg.link_mbps * 1e6 / (cfg.rail_gbps * 1e9), "rail_gbps": cfg.rail_gbps,
            "latency_s": cfg.latency_us * 1e-6}


def whole_collective_steps(schedule: Schedule, op: Op, scale: float) -> tuple[Step, ...]:
    """``op``'s steps cut out of its whole collective lowered by :func:`workloads.steps.lower`."""
    plan = schedule.step_plan(op.collective_id)
    return tuple(Step(tuple((t.dst, scaled_bytes(t.size_bytes, scale)) for t in step
                            if t.src == op.rank),
                      tuple((t.src, scaled_bytes(t.size_bytes, scale)) for t in step
                            if t.dst == op.rank))
                 for step in plan.steps)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bench_plans_are_build_plans_of_each_rank_alone(name: str) -> None:
    cfg, schedule, rails = case(name)
    bench = plan_bench(cfg, schedule, mirror=False, rails=rails)
    assert bench.controlled == [r for r in range(schedule.world_size)
                                if schedule.rail_of(r) < rails]
    assert list(bench.plan.programs) == bench.controlled
    for rank in bench.controlled:  # a planner of one rank lowers it in full, sharing nothing
        alone = build_plan(schedule, ranks=[rank], **plan_args(cfg))
        assert bench.plan.programs[rank] == alone.programs[rank], rank
        assert bench.plan.lanes[rank] == alone.lanes[rank], rank


@pytest.mark.parametrize("name", sorted(CASES))
def test_bench_job_is_the_full_plans_job_on_its_rails(name: str) -> None:
    cfg, schedule, rails = case(name)
    bench = plan_bench(cfg, schedule, mirror=False, rails=rails)
    full = build_plan(schedule, **plan_args(cfg))
    lanes = {lane for r in bench.controlled for lane in full.lanes[r] if lane != "compute"}
    assert bench.job.groups == {gid: full.groups[gid] for gid in lanes}
    assert bench.job.ranks == rail_job_ports(bench.controlled, schedule.cluster.gpus_per_server,
                                             cfg.effective_ports_per_rank)
    if rails == schedule.cluster.gpus_per_server:
        ports = rail_job_ports(range(schedule.world_size), schedule.cluster.gpus_per_server,
                               cfg.effective_ports_per_rank)
        assert bench.job == full.job("train", ports)


@pytest.mark.parametrize("name", sorted(CASES))
def test_calls_carry_their_share_of_the_whole_collective(name: str) -> None:
    cfg, schedule, _rails = case(name)
    scale = plan_args(cfg)["scale"]
    plan = build_plan(schedule, **plan_args(cfg))
    kinds = set()
    for rank, ops in plan.programs.items():
        by_tag = {op.tag: op for op in schedule.ops_of(rank)}
        for call in (op for op in ops if op.is_call):
            kinds.add(call.kind)
            assert call.steps == whole_collective_steps(schedule, by_tag[call.tag], scale), \
                (rank, call.collective_id)
    assert kinds >= ({"all_to_all"} if "ep" in name else {"all_reduce"})
