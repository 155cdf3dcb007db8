"""``workload.algorithms`` and ``workload.stragglers``: parsing, refusals with positions, the
schedule's algorithm-aware bytes, and the JSON round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads import WorkloadConfigError, generate_schedule, parse_workload
from workloads.schedule import Schedule

MOE = """\
cluster: {servers: 8, gpus_per_server: 1}
workload:
  model: mixtral-8x7b
  parallelism: {fsdp: 8, ep: 8}
"""


def _error(text: str) -> WorkloadConfigError:
    with pytest.raises(WorkloadConfigError) as info:
        parse_workload(text, "exp.yaml")
    return info.value


def test_algorithms_per_kind_and_per_axis() -> None:
    cfg = parse_workload(MOE + "  algorithms:\n    all_to_all: matchings\n"
                         "    all_reduce: {fsdp: stragglar, ep: ring}\n"
                         "  stragglers: {rank: 7, delay_ms: 50}\n", "exp.yaml")
    assert cfg.algorithm_for("all_to_all", "ep") == "matchings"
    assert cfg.algorithm_for("all_reduce", "fsdp") == "stragglar"
    assert cfg.algorithm_for("all_reduce", "ep") == "ring"
    assert cfg.algorithm_for("all_reduce", "dp") == "ring"  # the default
    assert cfg.algorithm_for("all_gather", "fsdp") == "ring"
    assert cfg.straggler_delay_s == {7: 0.05}


def test_an_algorithm_that_does_not_exist_for_the_kind_is_refused_at_its_place() -> None:
    err = _error(MOE + "  algorithms:\n    all_gather: matchings\n")
    assert err.position == "exp.yaml:6:17"
    assert "workload.algorithms.all_gather: algorithm 'matchings' does not exist for " \
        "all_gather; choose ring" in str(err)
    err = _error(MOE + "  algorithms:\n    all_to_all: {ep: stragglar}\n")
    assert err.position == "exp.yaml:6:22" and "choose pairwise or matchings or multihop" \
        in str(err)
    err = _error(MOE + "  algorithms:\n    alltoall: matchings\n")
    assert err.field == "workload.algorithms.alltoall" and "unknown collective kind" in str(err)
    err = _error(MOE + "  algorithms:\n    all_to_all: {epp: matchings}\n")
    assert "unknown axis 'epp'" in str(err) and err.position == "exp.yaml:6:23"


def test_a_straggler_outside_the_world_is_refused_at_its_rank() -> None:
    err = _error(MOE + "  stragglers:\n    - {rank: 3, delay_ms: 5}\n"
                 "    - {rank: 9, delay_ms: 5}\n")
    assert err.position == "exp.yaml:7:14"
    assert "workload.stragglers[1].rank: rank 9 is outside the world (0..7)" in str(err)
    err = _error(MOE + "  stragglers: {rank: -1, delay_ms: 5}\n")  # the one-mapping form
    assert err.position == "exp.yaml:5:22" and "outside the world" in str(err)
    err = _error(MOE + "  stragglers: {rank: 1, delay_ms: -5}\n")
    assert err.field == "workload.stragglers[0].delay_ms" and err.position == "exp.yaml:5:35"
    err = _error(MOE + "  stragglers: [{rank: 1, delay_ms: 5}, {rank: 1, delay_ms: 5}]\n")
    assert "listed twice" in str(err)
    err = _error(MOE + "  stragglers: {rank: 1, delay: 5}\n")
    assert "unknown key 'delay'" in str(err)


def test_stragglar_needs_one_straggler_per_power_of_two_group() -> None:
    err = _error(MOE + "  algorithms: {all_reduce: stragglar}\n")
    assert "stragglar needs a straggler" in str(err) and err.position == "exp.yaml:5:28"
    six = MOE.replace("servers: 8", "servers: 6").replace("fsdp: 8, ep: 8", "fsdp: 6")
    err = _error(six + "  algorithms: {all_reduce: {fsdp: stragglar}}\n"
                 "  stragglers: {rank: 1, delay_ms: 5}\n")
    assert "power-of-two size; the fsdp groups have 6 ranks" in str(err)
    err = _error(MOE + "  algorithms: {all_reduce: {fsdp: stragglar}}\n"
                 "  stragglers: [{rank: 1, delay_ms: 5}, {rank: 2, delay_ms: 5}]\n")
    assert "holds stragglers [1, 2]" in str(err)


def test_schedule_bytes_follow_the_algorithm_and_survive_the_json_round_trip(
        tmp_path: Path) -> None:
    base = generate_schedule(parse_workload(MOE))
    hop = generate_schedule(parse_workload(MOE + "  algorithms: {all_to_all: multihop}\n"
                                           "  stragglers: {rank: 7, delay_ms: 5}\n"))
    match = generate_schedule(parse_workload(MOE + "  algorithms: {all_to_all: matchings}\n"))
    a2a = next(op for op in base.ops_of(0) if op.kind == "all_to_all")
    for s, factor in ((base, 1.0), (match, 1.0), (hop, 16 / 7)):
        op = s.op(0, a2a.index)
        assert op.wire_bytes == pytest.approx(a2a.wire_bytes * factor)  # multihop relays
    assert hop.step_plan(a2a.collective_id).algorithm == "multihop"
    split = base.program(0).ops[a2a.index].split  # Mixtral's dispatch: uniform routing
    for s in (match, hop):  # every rank receives exactly the dispatch's blocks for it
        plan = s.step_plan(a2a.collective_id, with_blocks=True)
        blocks = {b.block_id: b for b in plan.blocks}
        for r in range(8):
            got = sum(blocks[b].size_bytes for step in plan.steps for t in step if t.dst == r
                      for b, _ in t.blocks if r in blocks[b].owners)
            assert got == sum(split) - split[r]
    path = tmp_path / "s.json"
    hop.to_json(str(path))
    back = Schedule.from_json(str(path))
    assert back == hop and back.config.stragglers == hop.config.stragglers
    assert back.config.algorithms == (("all_to_all", "", "multihop"),)
