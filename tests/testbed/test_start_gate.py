"""The start gate: its pipes (real FIFOs, threads as ranks), its summary, its setting."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from testbed.emulated.gate import GatePaths, GateTimeout, RankGate, RunnerGate, loaded_ranks
from testbed.experiment.config import parse_experiment
from testbed.metrics.startgate import first_op_starts, gate_summary
from workloads.errors import WorkloadConfigError

TIMEOUT_S = 10.0


def _rank(paths: GatePaths, rank: int, out: dict[int, tuple[float, float]],
          opened: threading.Event | None = None) -> None:
    gate = RankGate(paths)
    gate.open()
    if opened is not None:
        opened.wait(TIMEOUT_S)
    out[rank] = gate.pass_gate(rank, TIMEOUT_S)


def test_loaded_lines_name_ranks() -> None:
    assert loaded_ranks(["3", " 1 ", "", "x", "12"]) == {1, 3, 12}


def test_nobody_goes_before_the_last_rank_loaded(tmp_path: Path) -> None:
    released: list[float] = []
    gate = RunnerGate(tmp_path / "gate", range(3), on_release=released.append)
    out: dict[int, tuple[float, float]] = {}
    last_may_load = threading.Event()
    try:
        early = [threading.Thread(target=_rank, args=(gate.paths, r, out)) for r in (0, 1)]
        late = threading.Thread(target=_rank, args=(gate.paths, 2, out, last_may_load))
        for t in [*early, late]:
            t.start()
        deadline = time.monotonic() + TIMEOUT_S
        while gate.loaded != {0, 1} and time.monotonic() < deadline:
            time.sleep(0.005)
        assert gate.loaded == {0, 1}
        assert not gate.released.is_set() and not out  # rank 2 has not loaded: all wait
        last_may_load.set()
        for t in [*early, late]:
            t.join(TIMEOUT_S)
    finally:
        gate.close()
    assert sorted(out) == [0, 1, 2] and len(released) == 1
    last_loaded = max(t_loaded for t_loaded, _ in out.values())
    assert all(t_go >= released[0] >= last_loaded for _, t_go in out.values())


def test_a_gate_never_released_times_out(tmp_path: Path) -> None:
    gate = RunnerGate(tmp_path / "gate", range(2))
    try:
        rank = RankGate(gate.paths)
        with pytest.raises(GateTimeout):
            rank.pass_gate(0, timeout_s=0.05)
        deadline = time.monotonic() + TIMEOUT_S
        while gate.loaded != {0} and time.monotonic() < deadline:
            time.sleep(0.005)
        assert gate.loaded == {0} and not gate.released.is_set()  # rank 1 never loaded
    finally:
        gate.close()


def test_the_runner_may_release_early(tmp_path: Path) -> None:
    """A failure before every rank loaded: the runner lets the waiting ranks go (into an
    epoch the failover then aborts)."""
    gate = RunnerGate(tmp_path / "gate", range(2))
    out: dict[int, tuple[float, float]] = {}
    try:
        waiter = threading.Thread(target=_rank, args=(gate.paths, 0, out))
        waiter.start()
        deadline = time.monotonic() + TIMEOUT_S
        while gate.loaded != {0} and time.monotonic() < deadline:
            time.sleep(0.005)
        gate.release()
        gate.release()  # idempotent
        waiter.join(TIMEOUT_S)
    finally:
        gate.close()
        gate.close()
    assert list(out) == [0] and gate.t_release_s is not None
    assert out[0][1] >= gate.t_release_s


def _records(loaded: list[float], go: float, first: list[float]) -> list[dict[str, object]]:
    recs: list[dict[str, object]] = []
    for rank, (t_l, t_f) in enumerate(zip(loaded, first, strict=True)):
        recs.append({"ev": "gate", "rank": rank, "t_loaded": t_l, "t_go": go + 0.001 * rank})
        recs.append({"ev": "call", "rank": rank, "it": 0, "t_intent": t_f + 0.5})
        recs.append({"ev": "compute", "rank": rank, "it": 0, "t_start": t_f})
    return recs


def test_gate_summary_from_records() -> None:
    s = gate_summary(_records([1.0, 1.5], 1.6, [1.7, 1.8]))
    assert s is not None
    assert s["ranks"] == 2 and s["ranks_started_early"] == []
    assert s["loading_spread_s"] == pytest.approx(0.5)
    assert s["release_skew_s"] == pytest.approx(0.001)
    assert s["release_after_last_loaded_s"] == pytest.approx(0.1)
    assert s["first_op_after_release_s"] == pytest.approx(0.1)
    assert s["wait_max_s"] == pytest.approx(0.6)


def test_gate_summary_names_ranks_that_started_before_the_last_loaded() -> None:
    s = gate_summary(_records([1.0, 2.0], 2.1, [1.2, 2.2]))
    assert s is not None and s["ranks_started_early"] == [0]


def test_no_gate_records_no_summary() -> None:
    assert gate_summary([{"ev": "call", "rank": 0, "it": 0, "t_intent": 1.0}]) is None


def test_first_ops_skip_later_epochs() -> None:
    recs = [{"ev": "compute", "rank": 0, "it": 0, "t_start": 5.0},
            {"ev": "compute", "rank": 0, "it": 0, "t_start": 1.0, "epoch": 1}]
    assert first_op_starts(recs) == {0: 5.0}


DOC = """
cluster: {servers: 4, gpus_per_server: 1}
workload:
  model: llama3-8b
  parallelism: {tp: 1, fsdp: 2, pp: 2}
run: {start_gate: GATE}
"""


def test_start_gate_setting() -> None:
    assert parse_experiment(DOC.replace("GATE", "true")).start_gate is True
    assert parse_experiment(DOC.replace("GATE", "false")).to_json()["start_gate"] is False
    assert parse_experiment(DOC.replace("run: {start_gate: GATE}", "")).start_gate is True
    with pytest.raises(WorkloadConfigError, match=r"run\.start_gate"):
        parse_experiment(DOC.replace("GATE", "3"))


def test_a_rank_that_opens_the_gate_after_an_early_release_goes_at_once(tmp_path: Path) -> None:
    """The runner releases every rank when one fails while others still load; a rank that
    opens ``go`` only afterwards never had a writer beside it, so poll would not wake it: it
    must see the release at once, not wait for its timeout."""
    gate = RunnerGate(tmp_path / "gate", range(2))
    try:
        gate.release()
        late = RankGate(gate.paths)
        late.open()
        t0 = time.monotonic()
        t_loaded, t_go = late.pass_gate(1, timeout_s=5.0)
        assert time.monotonic() - t0 < 1.0 and t_go >= t_loaded
    finally:
        gate.close()
