"""``opus-testbed bench counters`` on a real rail (root): every case is answered, each
single-port counters request with its own port's counters only (the bench asserts that), and
the network is gone afterwards. Its figures are the bench's, not asserted here."""

from __future__ import annotations

from emulator.bench import run_counters_bench
from emulator.runstate import load_records


def test_counters_bench_answers_every_case_and_leaves_nothing() -> None:
    before = {r.prefix for r in load_records()}
    result = run_counters_bench(ports=4, touched=(2,), repeats=5, progress=lambda _m: None)
    assert (result["benchmark"], result["ports"], result["repeats"]) == ("counters", 4, 5)
    assert set(result["round_trip_ms"]) == {"barrier", "every_port", "2_ports"}
    assert all(f["p50"] > 0 for f in result["round_trip_ms"].values())
    assert {r.prefix for r in load_records()} <= before
