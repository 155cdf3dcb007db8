"""``opus-testbed bench intents``: the figures it reports count what it ran."""

from __future__ import annotations

from controller.bench import bench_core, bench_queue, run_intents_bench


def test_core_bench_serves_every_call_and_switches_once_per_phase() -> None:
    """1024 ranks on 8 rails, K=2: 128 DP rings of 8 and 512 PP pairs, 4 calls per phase.
    Each ring's first call switches it in (128 decisions); each pair's first call switches its
    ranks' ring circuits out (512, base mode); later calls of a phase find their circuits lit.
    """
    res = bench_core(iterations=1)
    assert res["intents"] == res["acks"] == 4 * (128 * 8 + 512 * 2)
    assert res["decisions"] == 128 + 512
    assert bench_core(iterations=2)["decisions"] == 2 * (128 + 512)  # every phase change


def test_intents_bench_reports_its_samples() -> None:
    """The loopback ack latency is a wall-clock measurement: only its shape is asserted."""
    res = run_intents_bench(n_calls=100, iterations=1, repeats=1, queue_depths=(3, 30))
    assert res["detail"]["ack_samples"] == 100
    assert 0 < res["ack_ms"]["p50"] <= res["ack_ms"]["p99"]
    assert res["detail"]["core_acks"] == 4 * (128 * 8 + 512 * 2)
    assert res["core_intents_per_s"] > 0
    assert [row["depth"] for row in res["queue"]] == [3, 30]
    assert all(row["intent_us"] > 0 and row["complete_us"] > 0 and row["served_us"] > 0
               for row in res["queue"])


def test_queue_bench_runs_beside_a_queue_of_the_depth_it_names() -> None:
    """bench_queue checks its own premise: ``depth`` calls queued while the probe pair runs
    (else RuntimeError), and every one of them acked once the blockers finish."""
    res = bench_queue(200, rounds=20)
    assert res["depth"] == 200
    assert res["served_us"] > 0
