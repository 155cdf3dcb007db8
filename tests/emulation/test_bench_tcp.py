"""``opus-testbed bench tcp`` runs its exchanges end to end (root). Figures are the bench's."""

from __future__ import annotations

from emulator.bench import TCP_CASES, run_tcp_bench
from emulator.hostnet import tcp_queue_limit_bytes
from emulator.runstate import load_records


def test_tcp_bench_measures_every_case_with_both_queue_caps() -> None:
    before = {r.prefix for r in load_records()}
    result = run_tcp_bench(link_mbps=8.0, nbytes=100_000, trials=1, late_s=0.02,
                           progress=lambda _m: None)
    assert [r["tcp_queue"] for r in result["results"]] == ["project", "kernel"]
    project, kernel = result["results"]
    assert project["tcp_limit_output_bytes"] == tcp_queue_limit_bytes(8.0)
    assert kernel["tcp_limit_output_bytes"] != project["tcp_limit_output_bytes"]
    for row in result["results"]:
        assert [row[c]["flows"] for c in TCP_CASES] == [1, 2, 1]
        for case in TCP_CASES:  # every flow delivered its bytes: no time is far below ideal
            assert row[case]["median"] > 0.8, (row["tcp_queue"], case, row[case])
    assert {r.prefix for r in load_records()} <= before  # both networks torn down
