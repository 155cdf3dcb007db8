"""The rank plan (:mod:`testbed.plan.rankplan`): one record, one JSON form, one set of defaults,
for the replayed ranks, the standby spares and the torch ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.emulated.replayer import read_plan
from testbed.plan.rankplan import (
    MIN_IO_TIMEOUT_S,
    PlanRecord,
    RankPlan,
    RankPlanError,
    ReplayPart,
    StandbyPlan,
    TorchPart,
    load_plan,
    plan_record,
    replay_io_timeout_s,
)
from testbed.plan.replay import PlanOp, Step


def replay_plan() -> RankPlan:
    ops = (PlanOp(0, "compute", (), duration_s=0.01),
           PlanOp(1, "dp0", (0,), kind="all_reduce", axis="dp", collective_id="c1",
                  size_bytes=1024, wire_bytes=512, steps=(Step(((1, 256),), ((1, 256),)),),
                  tag="grad"))
    return RankPlan(rank=0, job="train", endpoint="198.18.0.254:6000",
                    peers={0: "198.19.0.1", 1: "198.19.0.2"}, records="/r/rank0.jsonl",
                    ack_timeout_s=120.0, io_timeout_s=30.0, time_dilation=2.0,
                    failover={"host": 0, "epoch": 0, "start_it": 0},
                    replay=ReplayPart("198.19.0.1", 7000, 5, ops,
                                      gate={"loaded": "/g/loaded", "go": "/g/go"},
                                      artifact={"host": "h", "port": 1, "local_rank": 0,
                                                "comms": {}}, rail_state_ack_timeout_s=20.0))


def torch_plan() -> RankPlan:
    return RankPlan(rank=1, job="train", endpoint=None,
                    peers={0: "/s/r0.sock", 1: ("127.0.0.1", 4001)}, records="/r/rank1.jsonl",
                    ack_timeout_s=60.0, io_timeout_s=60.0,
                    torch=TorchPart(2, 2, "127.0.0.1", 4000, (("127.0.0.1", 4001), "/s/r1.sock"),
                                    "/r/rank1.log", "job.py", ("--steps", "3"),
                                    axes={"mesh_fsdp": "fsdp"}, scale_up_dir="/s"))


@pytest.mark.parametrize("plan", [replay_plan(), torch_plan()], ids=["replay", "torch"])
def test_a_plan_survives_its_json_form(plan: RankPlan) -> None:
    text = json.dumps(plan.to_json())  # what crosses the process boundary
    assert RankPlan.from_json(json.loads(text)) == plan
    assert load_plan(json.loads(text)) == plan


def test_a_standby_plan_survives_its_json_form() -> None:
    plan = StandbyPlan("/r/spare0.jsonl", {"host": 4, "faults": []})
    assert load_plan(json.loads(json.dumps(plan.to_json()))) == plan


def test_both_writers_name_the_records_file_alike() -> None:
    """The supervisor wrote ``out`` where the torch runner wrote ``records``: one key now."""
    assert replay_plan().to_json()["records"] == "/r/rank0.jsonl"
    assert torch_plan().to_json()["records"] == "/r/rank1.jsonl"
    assert "out" not in replay_plan().to_json()


def test_the_defaults_are_the_records_own() -> None:
    d = replay_plan().to_json()
    del d["time_dilation"], d["failover"], d["gate"], d["artifact"]
    del d["rail_state_ack_timeout_s"]
    plan = RankPlan.from_json(d)
    assert plan.time_dilation == 1.0 and plan.failover is None
    assert plan.replay is not None and plan.replay.gate is None and plan.replay.artifact is None
    assert plan.replay.rail_state_ack_timeout_s is None  # the call waits for the light


@pytest.mark.parametrize("key", ["io_timeout_s", "ack_timeout_s", "records", "ops", "rank"])
def test_a_missing_key_is_named(key: str) -> None:
    """No reader-side fallback (the replayer once read a missing io_timeout_s as 60 s)."""
    d = replay_plan().to_json()
    del d[key]
    with pytest.raises(RankPlanError, match=f"missing key.*{key}"):
        RankPlan.from_json(d)


def test_an_unknown_key_is_named_with_the_known_ones() -> None:
    d = {**replay_plan().to_json(), "out": "/r/rank0.jsonl"}  # the old spelling
    with pytest.raises(RankPlanError, match=r"unknown key\(s\) out.*known: .*records"):
        RankPlan.from_json(d)
    with pytest.raises(RankPlanError, match=r"standby plan: unknown key\(s\) out"):
        load_plan({"standby": True, "out": "x", "records": "x", "failover": {}})


def test_a_value_of_the_wrong_kind_is_an_error() -> None:
    d = {**replay_plan().to_json(), "port": "not a port"}
    with pytest.raises(RankPlanError, match="wrong kind"):
        RankPlan.from_json(d)


def test_a_plan_runs_a_replay_or_a_torch_script() -> None:
    with pytest.raises(RankPlanError, match=r"exactly one.*neither"):
        RankPlan(0, "train", None, {}, "/r", 1.0, 1.0)


def test_the_replay_io_timeout_is_ten_iterations_and_at_least_30_s() -> None:
    assert replay_io_timeout_s(0.5) == MIN_IO_TIMEOUT_S == 30.0
    assert replay_io_timeout_s(7.0) == 70.0


def test_the_replayer_reads_a_file_and_names_it_in_errors(tmp_path: Path) -> None:
    good, bad = tmp_path / "rank0.plan.json", tmp_path / "rank1.plan.json"
    good.write_text(json.dumps(replay_plan().to_json()))
    assert read_plan(str(good)) == replay_plan()
    bad.write_text(json.dumps({k: v for k, v in replay_plan().to_json().items() if k != "job"}))
    with pytest.raises(RankPlanError, match=f"{bad}: .*missing key.*job"):
        read_plan(str(bad))


def test_the_results_readers_take_a_replayed_ranks_plan_or_the_sims_record() -> None:
    part = replay_plan().replay
    assert part is not None
    record = PlanRecord(3, 5, part.ops)  # the sim backend's, which starts no rank process
    assert plan_record(json.loads(json.dumps(record.to_json()))) == record
    from_rank = plan_record(replay_plan().to_json())
    assert from_rank is not None and from_rank.ops == record.ops and from_rank.iterations == 5
    assert plan_record(torch_plan().to_json()) is None  # a torch rank has no ops
    assert plan_record(StandbyPlan("/r/s.jsonl", {}).to_json()) is None
    with pytest.raises(RankPlanError, match=r"f\.json: a value of the wrong kind"):
        plan_record({"rank": "x", "iterations": 1, "ops": []}, "f.json")
